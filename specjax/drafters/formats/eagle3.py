"""EAGLE-3's tensors (SafeAILab/EAGLE `cnets.py`, speculators' Eagle3) as params of specjax's
EAGLE head with HeadOptions(eagle3=True) (models/heads.py), and its draft-vocabulary map.

  fc.weight                              [D, n·D]    -> fc [n·D, D] (raw target states, no norm)
  fc.bias (early speculators files)      [D]         -> fc_bias
  {p}.self_attn.{q,k,v}_proj.weight      [·, 2D]     -> layers.0.attn.{q,k,v}_proj [2D, heads, d_head]
  {p}.self_attn.o_proj.weight            [D, H·hd]   -> layers.0.attn.o_proj [H, d_head, D]
  {p}.mlp.{gate,up,down}_proj.weight                 -> layers.0.mlp.*
  {p}.input_layernorm.weight             [D]         -> layers.0.input_norm (on the token embedding)
  {p}.hidden_norm.weight                 [D]         -> hidden_norm (on g)
  {p}.post_attention_layernorm.weight    [D]         -> layers.0.post_attention_norm
  norm.weight                            [D]         -> final_norm
  lm_head.weight                         [Vd, D]     -> lm_head [D, Vd]
  d2t                                    [Vd] int    -> d2t (target id = draft id + d2t[draft id])
  t2d                                    [V] bool    checked against d2t, not kept
{p} is `midlayer` (EAGLE's files) or `layers.0` (speculators').
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from specjax.drafters.formats.files import HeadTensors
from specjax.io.hf_weights import _mlp_from_hf, _split_heads_in, _split_heads_out
from specjax.models import ModelConfig


def eagle3_params(t: HeadTensors, head: ModelConfig, prefix: str, num_layers: int, draft_vocab: int):
    """(params, draft vocabulary size) of an EAGLE-3 head reading `num_layers` target layers."""
    d, v, hd = head.hidden_size, head.vocab_size, head.resolved_head_dim
    h, kv = head.num_attention_heads, head.num_key_value_heads
    if head.attention_bias or head.o_proj_bias:
        raise ValueError(f"{t.source}: EAGLE-3 heads with attention biases are not supported")
    if t.has("fc.weight") and tuple(t.tensors["fc.weight"].shape) != (d, num_layers * d):
        raise ValueError(
            f"{t.source}: fc.weight has shape {tuple(t.tensors['fc.weight'].shape)}, but reading {num_layers} target "
            f"layers of hidden size {d} needs {(d, num_layers * d)}"
        )
    p = f"{prefix}.self_attn"
    attn = {
        "q_proj": _split_heads_in(t.get(f"{p}.q_proj.weight", (h * hd, 2 * d)), h),  # [2D, H, d_head]
        "k_proj": _split_heads_in(t.get(f"{p}.k_proj.weight", (kv * hd, 2 * d)), kv),
        "v_proj": _split_heads_in(t.get(f"{p}.v_proj.weight", (kv * hd, 2 * d)), kv),
        "o_proj": _split_heads_out(t.get(f"{p}.o_proj.weight", (d, h * hd)), h),  # [H, d_head, D]
    }
    layer = {
        "input_norm": {"scale": t.get(f"{prefix}.input_layernorm.weight", (d,))},
        "attn": attn,
        "post_attention_norm": {"scale": t.get(f"{prefix}.post_attention_layernorm.weight", (d,))},
        "mlp": _mlp_from_hf(head, t.get, prefix),
    }
    if t.has("lm_head.weight") and t.tensors["lm_head.weight"].shape[0] != draft_vocab:
        raise ValueError(
            f"{t.source}: lm_head.weight has {t.tensors['lm_head.weight'].shape[0]} rows, config.json says "
            f"draft_vocab_size={draft_vocab}"
        )
    params = {
        "fc": t.get("fc.weight", (d, num_layers * d)).T,  # [n·D, D]
        "layers": {0: layer},
        "hidden_norm": {"scale": t.get(f"{prefix}.hidden_norm.weight", (d,))},
        "final_norm": {"scale": t.get("norm.weight", (d,))},
        "lm_head": t.get("lm_head.weight", (draft_vocab, d)).T,  # [D, Vd]
    }
    if t.has("fc.bias"):
        params["fc_bias"] = t.get("fc.bias", (d,))
    d2t = _draft_to_target(t, draft_vocab, v)
    if d2t is not None:
        params["d2t"] = d2t
    return params, draft_vocab


def _draft_to_target(t: HeadTensors, draft_vocab: int, vocab: int):
    """d2t [Vd] int32, checked (every target id exists, none twice, t2d agrees); None for the identity."""
    if draft_vocab > vocab:
        raise ValueError(f"{t.source}: a draft vocabulary of {draft_vocab} is larger than the target's ({vocab})")
    if not t.has("d2t"):
        if draft_vocab < vocab:
            raise ValueError(f"{t.source} lacks d2t, which a draft vocabulary of {draft_vocab} < {vocab} needs")
        if t.has("t2d"):
            t.raw("t2d", (vocab,))
        return None
    offsets = np.asarray(t.raw("d2t", (draft_vocab,))).astype(np.int64)
    ids = np.arange(draft_vocab) + offsets
    if ids.min() < 0 or ids.max() >= vocab or len(np.unique(ids)) != draft_vocab:
        raise ValueError(
            f"{t.source}: d2t maps the draft vocabulary to target ids outside 0..{vocab - 1} or to one id twice "
            f"(target id = draft id + d2t[draft id])"
        )
    if t.has("t2d"):
        t2d = np.asarray(t.raw("t2d", (vocab,))).astype(bool)
        if int(t2d.sum()) != draft_vocab or not t2d[ids].all():
            raise ValueError(f"{t.source}: t2d and d2t disagree on which target tokens the draft vocabulary holds")
    return jnp.asarray(offsets, jnp.int32) if offsets.any() else None
