"""Torch references of the published draft heads, built from transformers' own Llama modules.

The reference packages cannot be test dependencies (eagle-llm pins old gradio, openai and
accelerate and breaks under transformers 5; EAGLE-3 is not on PyPI), so their forward is
mirrored here: transformers' LlamaDecoderLayer / LlamaRMSNorm / LlamaRotaryEmbedding plus
the glue each format adds. This glue was checked to reproduce eagle-llm 1.2.1's EAGLE-1
model to 7.6e-6 and SafeAILab/EAGLE's EAGLE-3 model to 2.4e-6 in fp32
(../shared/reference/HEAD_FORMATS.md section 7). Each module's state_dict() has exactly
the published tensor names, so a test writes it as the checkpoint.

Pairing, as the references feed it: entry i is (token_{i+1}, target state at i) at rotary
position i, and predicts token i + 2. specjax feeds the same pair at position i + 1.
"""

from __future__ import annotations

import torch
import transformers
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding


def head_llama_config(target: transformers.LlamaConfig, **changes) -> transformers.LlamaConfig:
    """The head's one-layer Llama config (what EAGLE's config.json holds), eager attention."""
    fields = {
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": 48,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": target.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        **changes,
    }
    config = transformers.LlamaConfig(**fields)
    config._attn_implementation = "eager"
    return config


def _causal(x: torch.Tensor) -> torch.Tensor:
    t = x.shape[1]
    return torch.full((t, t), float("-inf")).triu(1)[None, None]  # [1, 1, T, T] additive


def _run_layer(layer, rotary, x, attn_in=None):
    """One decoder layer at positions 0..T-1; `attn_in` replaces its attention input (EAGLE-3)."""
    positions = torch.arange(x.shape[1])[None]
    rope = rotary(x, positions)
    if attn_in is None:
        return layer(x, attention_mask=_causal(x), position_ids=positions, position_embeddings=rope)
    h, _ = layer.self_attn(attn_in, attention_mask=_causal(x), position_ids=positions, position_embeddings=rope)
    y = x + h
    return y + layer.mlp(layer.post_attention_layernorm(y))


class Eagle1(nn.Module):
    """EAGLE-1/2 (eagle-llm cnets.Model): fc over [embed; h], layer 0 without input norm, no final norm."""

    def __init__(self, config: transformers.LlamaConfig, bias: bool):
        super().__init__()
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.fc = nn.Linear(2 * d, d, bias=bias)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0)])
        self.layers[0].input_layernorm = nn.Identity()
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, hidden, ids):  # [B, T, D] post-norm target states, [B, T] -> [B, T, D]
        x = self.fc(torch.cat([self.embed_tokens(ids), hidden], dim=-1))
        return _run_layer(self.layers[0], self.rotary, x)


class Eagle3(nn.Module):
    """EAGLE-3 (SafeAILab/EAGLE cnets.py): raw fc over 3 target states, 2D-wide q/k/v over
    [input_layernorm(embed); hidden_norm(g)], residual g, own norm + lm_head over Vd."""

    def __init__(self, config: transformers.LlamaConfig, draft_vocab: int, d2t: torch.Tensor, speculators=False):
        super().__init__()
        d, hd = config.hidden_size, config.hidden_size // config.num_attention_heads
        self.fc = nn.Linear(3 * d, d, bias=False)
        layer = LlamaDecoderLayer(config, 0)
        for name, heads in (("q_proj", config.num_attention_heads), ("k_proj", config.num_key_value_heads)):
            setattr(layer.self_attn, name, nn.Linear(2 * d, heads * hd, bias=False))
        layer.self_attn.v_proj = nn.Linear(2 * d, config.num_key_value_heads * hd, bias=False)
        layer.hidden_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        if speculators:  # speculators' files name the layer layers.0, EAGLE's midlayer
            self.layers = nn.ModuleList([layer])
        else:
            self.midlayer = layer
        self.norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(d, draft_vocab, bias=False)
        self.register_buffer("d2t", d2t.long())
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[torch.arange(draft_vocab) + d2t] = True
        self.register_buffer("t2d", t2d)
        self.rotary = LlamaRotaryEmbedding(config)
        self.vocab_size = config.vocab_size

    def forward(self, hidden3, ids, embed: nn.Embedding):  # [B, T, 3D], [B, T] -> target logits [B, T, V]
        layer = self.layers[0] if hasattr(self, "layers") else self.midlayer
        g = self.fc(hidden3)
        e = embed(ids)
        attn_in = torch.cat([layer.input_layernorm(e), layer.hidden_norm(g)], dim=-1)
        draft = self.lm_head(self.norm(_run_layer(layer, self.rotary, g, attn_in)))  # [B, T, Vd]
        full = torch.full((*draft.shape[:-1], self.vocab_size), float("-inf"))
        full[..., torch.arange(draft.shape[-1]) + self.d2t] = draft
        return full


class ResBlock(nn.Module):
    """Medusa's residual block: x + SiLU(Linear(x))."""

    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, x):
        return x + nn.functional.silu(self.linear(x))


def medusa_heads(d: int, vocab: int, num_heads: int, num_layers: int, lm_heads: bool) -> nn.ModuleList:
    """medusa_model.py's heads: one ResBlock object repeated num_layers times (tied, as the
    reference builds them), then in Medusa-1 a per-head LM head. Keys {h}.{l}.linear.*, {h}.{L}.weight."""
    heads = []
    for _ in range(num_heads):
        blocks = [ResBlock(d)] * num_layers
        heads.append(nn.Sequential(*blocks, *([nn.Linear(d, vocab, bias=False)] if lm_heads else [])))
    return nn.ModuleList(heads)


def perturb(module: nn.Module, scale: float, seed: int) -> nn.Module:
    """Random weights of `scale` (matrices / sqrt(fan-in)) and norms and biases away from 1 and 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if p.ndim == 1:
                p.copy_((1.0 if "norm" in name else 0.0) + 0.2 * noise)
            else:
                p.copy_(scale * noise / p.shape[-1] ** 0.5)
    return module
