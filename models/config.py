"""Model hyper-parameters, named exactly as Hugging Face's configs name them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

# The architectures a ModelConfig can describe. All but "gpt2" run the shared decoder of
# models/llama.py; a family file holds only what differs (models/qwen3.py, gemma.py, moe.py).
# "qwen2", "mistral" and "phi3" run the Llama module itself: they differ only in which
# biases exist or in how HF lays out the weights. The name picks the HF class a save writes.
LLAMA_FAMILY = ("llama", "qwen2", "mistral", "phi3", "qwen3", "gemma2", "gemma3_text", "mixtral", "qwen3_moe")
MODEL_TYPES = (*LLAMA_FAMILY, "gpt2")
GEMMA_TYPES = ("gemma2", "gemma3_text")
MOE_TYPES = ("mixtral", "qwen3_moe")
# Weight formats (models/quant.py): float32 is the params in `dtype`, as always; the others
# hold the projection and embedding matrices as bfloat16 or int8 (with float32 scales).
WEIGHT_FORMATS = ("float32", "bfloat16", "int8")
# Families with an RMSNorm over d_head of every q and k head, before the rotation.
QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3_text")
# Families whose HF attention_bias means biases on q, k, v and o together.
_ALL_FOUR_BIASES = ("llama", "qwen3", "qwen3_moe", *GEMMA_TYPES)
# Families whose HF config has per-layer `layer_types`; the others slide every layer or none.
_PER_LAYER_WINDOWS = ("qwen2", "qwen3", *GEMMA_TYPES)
LAYER_TYPES = ("full_attention", "sliding_attention")  # in this order: LAYER_TYPES[slides]

# Rotary scaling as transformers computes it (models/rope.py): HF's rope_scaling keys per
# rope_type, required keys first. "dynamic" (NTK) equals the default rotation at every
# position below max_position_embeddings, the only positions specjax runs.
ROPE_SCALING_KEYS = {
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    ),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Static description of a decoder: the Llama family or GPT-2 (see `model_type`).

    Frozen and hashable so it can be a static argument of `jax.jit`: two models with
    equal configs share compiled programs.

    Fields beyond HF's LlamaConfig names:
      attention_bias: a bias on q, k and v (Qwen2 style). HF Llama's `attention_bias=True`
        also puts one on o_proj, which is `o_proj_bias` here.
      o_proj_bias: a bias on the attention output projection.
      mlp_bias: biases on gate, up and down projections (HF Llama `mlp_bias`).
      model_type: one of MODEL_TYPES; HF's `model_type` of the class a save writes.
      weights: the weight format (WEIGHT_FORMATS, models/quant.py). "float32": every param in
        `dtype`, today's numerics. "bfloat16" / "int8": the projection, embedding and LM head
        matrices stored so (int8 with a float32 scale per output channel, `<name>_scale`);
        `dtype` (then float32) is that of the activations, norms and biases. Set by
        specjax.io.weight_formats.with_weights, never by a checkpoint.
    Fields of the newer families (HF names; None or 0 where a family has no such thing):
      rope_scaling: HF's rope_scaling dict without rope_theta ({"rope_type": "llama3",
        "factor": 8.0, ...}), stored as its sorted (key, value) pairs so the config stays
        hashable and serialisable; a dict is accepted and converted. Keys: ROPE_SCALING_KEYS.
      rope_local_base_freq: Gemma 3's rotary base on its sliding-window layers (no scaling
        there); rope_theta and rope_scaling then apply to its global layers.
      sliding_window: a query at position p sees keys at positions > p - sliding_window
        on the layers that slide: all of them when `layer_types` is None, else those marked
        "sliding_attention" (Qwen2/Qwen3 max_window_layers, Gemma's local/global pattern).
        Kept even where it cannot bind (Gemma 3's rotary base follows the layer type);
        canonical forms: layer_types None when all layers slide, both None when none does.
      query_pre_attn_scalar: Gemma's attention scores are q.k / sqrt(this), not / sqrt(d_head).
      attn_logit_softcapping, final_logit_softcapping: Gemma 2's cap * tanh(x / cap) on
        attention scores and on the output logits.
      num_experts, num_experts_per_tok, norm_topk_prob: the MoE router (Mixtral's
        num_local_experts is num_experts and it always renormalises the top k); for MoE
        types `intermediate_size` is each expert's (Qwen3-MoE's moe_intermediate_size).
    For "gpt2" the HF names map as n_embd -> hidden_size, n_layer -> num_hidden_layers,
    n_head -> num_attention_heads (= num_key_value_heads), n_inner -> intermediate_size,
    n_positions -> max_position_embeddings, and `rms_norm_eps` holds the LayerNorm epsilon
    (layer_norm_epsilon); rope_theta is unused, and every linear layer has a bias.
    """

    vocab_size: int = 259
    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = False  # LlamaConfig's default
    attention_bias: bool = False
    head_dim: int | None = None
    dtype: str = "float32"
    o_proj_bias: bool = False
    mlp_bias: bool = False
    model_type: str = "llama"
    rope_scaling: tuple | None = None
    rope_local_base_freq: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    norm_topk_prob: bool = True
    weights: str = "float32"

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"ModelConfig.model_type must be one of {', '.join(MODEL_TYPES)}, got {self.model_type!r}")
        # Canonical forms, so that equal models have equal (hash-equal) configs.
        object.__setattr__(self, "rope_scaling", _canonical_rope_scaling(self.rope_scaling))
        window, types = self._canonical_layer_types()
        object.__setattr__(self, "sliding_window", window)
        object.__setattr__(self, "layer_types", types)
        positive = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                "num_attention_heads must be a multiple of num_key_value_heads, got "
                f"{self.num_attention_heads} and {self.num_key_value_heads}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}; set head_dim explicitly"
            )
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"ModelConfig.sliding_window must be >= 1 or None, got {self.sliding_window}")
        if self.model_type == "gpt2":
            self._check_gpt2()
        else:
            self._check_llama_family()
        self._check_weights()

    def _check_weights(self):
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {self.weights!r}")
        if self.weights == "float32":
            return
        if self.model_type == "gpt2" or self.model_type in MOE_TYPES:
            raise ValueError(f"weights={self.weights!r} is not supported for model_type {self.model_type!r} yet")
        if self.dtype != "float32":
            raise ValueError(
                f"weights={self.weights!r} keeps activations, norms and biases in float32: dtype must be "
                f"'float32', got {self.dtype!r}"
            )

    def _canonical_layer_types(self) -> tuple[int | None, tuple[str, ...] | None]:
        """(sliding_window, layer_types): types None when every layer is alike, and no window
        when no layer slides."""
        if self.layer_types is None:
            return self.sliding_window, None
        types = tuple(self.layer_types)
        if len(types) < self.num_hidden_layers or any(t not in LAYER_TYPES for t in types):
            raise ValueError(
                f"layer_types must give one of {', '.join(LAYER_TYPES)} for each of the "
                f"{self.num_hidden_layers} layers, got {list(types)}"
            )
        # A shallower copy (LayerSkip's early exit) keeps the types of the layers it keeps.
        types = types[: self.num_hidden_layers]
        if self.sliding_window is None or "sliding_attention" not in types:
            return None, None
        return self.sliding_window, None if set(types) == {"sliding_attention"} else types

    def _check_llama_family(self):
        if self.resolved_head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.resolved_head_dim}")
        self._check_family_fields()
        # The HF classes of these two types have fixed biases; a save must be able to say so.
        if self.model_type == "qwen2" and (not self.attention_bias or self.o_proj_bias or self.mlp_bias):
            raise ValueError(
                "model_type 'qwen2' means q/k/v biases only: attention_bias=True, o_proj_bias=False, mlp_bias=False"
            )
        if self.model_type == "mistral" and (self.attention_bias or self.o_proj_bias or self.mlp_bias):
            raise ValueError(
                "model_type 'mistral' has no biases: attention_bias, o_proj_bias and mlp_bias must be False"
            )

    def _check_family_fields(self):
        """Each family's HF class can express only some of the newer fields; a save must be able to."""
        mt = self.model_type
        if mt in _ALL_FOUR_BIASES and mt != "llama" and (self.attention_bias != self.o_proj_bias or self.mlp_bias):
            raise ValueError(
                f"model_type {mt!r} has HF's attention_bias (q, k, v and o together) and no MLP biases: "
                "attention_bias must equal o_proj_bias, and mlp_bias must be False"
            )
        if mt in ("phi3", *MOE_TYPES) and (self.attention_bias or self.o_proj_bias or self.mlp_bias):
            raise ValueError(f"model_type {mt!r} has no biases: attention_bias, o_proj_bias and mlp_bias must be False")
        if mt == "llama" and self.sliding_window is not None:
            raise ValueError("model_type 'llama' has no sliding window (HF Llama ignores one); use 'mistral'")
        if self.layer_types is not None and mt not in _PER_LAYER_WINDOWS:
            raise ValueError(
                f"per-layer layer_types are for {', '.join(_PER_LAYER_WINDOWS)}; model_type {mt!r} slides "
                "every layer or none (set only sliding_window)"
            )
        gemma = mt in GEMMA_TYPES
        if gemma != (self.query_pre_attn_scalar is not None):
            raise ValueError("query_pre_attn_scalar must be set for the Gemma types and only for them")
        if not gemma and (self.attn_logit_softcapping is not None or self.final_logit_softcapping is not None):
            raise ValueError("attn_logit_softcapping and final_logit_softcapping are Gemma-only")
        for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"ModelConfig.{name} must be > 0 or None, got {value}")
        if (self.rope_local_base_freq is not None) != (mt == "gemma3_text"):
            raise ValueError("rope_local_base_freq must be set for model_type 'gemma3_text' and only for it")
        if (mt in MOE_TYPES) != (self.num_experts > 0):
            raise ValueError(
                f"num_experts must be >= 1 for {' and '.join(MOE_TYPES)} and 0 otherwise, got {self.num_experts}"
            )
        if mt in MOE_TYPES:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok must lie in [1, num_experts={self.num_experts}], "
                    f"got {self.num_experts_per_tok}"
                )
            if mt == "mixtral" and not self.norm_topk_prob:
                raise ValueError("Mixtral always renormalises its top-k router weights: norm_topk_prob must be True")

    def _check_gpt2(self):
        newer = ("rope_scaling", "rope_local_base_freq", "sliding_window", "layer_types", "query_pre_attn_scalar")
        if any(getattr(self, name) is not None for name in newer) or self.num_experts:
            raise ValueError(f"GPT-2 has none of {', '.join(newer)} or experts")
        if self.num_key_value_heads != self.num_attention_heads:
            raise ValueError(
                "GPT-2 has no grouped-query attention: num_key_value_heads must equal num_attention_heads, got "
                f"{self.num_key_value_heads} and {self.num_attention_heads}"
            )
        if self.head_dim not in (None, self.hidden_size // self.num_attention_heads):
            raise ValueError(f"GPT-2 head_dim is hidden_size // num_attention_heads; got head_dim={self.head_dim}")
        if self.attention_bias or self.o_proj_bias or self.mlp_bias:
            raise ValueError("GPT-2 always has every bias; attention_bias, o_proj_bias and mlp_bias are Llama-only")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def layer_slides(self, layer: int) -> bool:
        """Whether `layer` is a "sliding_attention" layer (see sliding_window)."""
        if self.layer_types is None:
            return self.sliding_window is not None
        return self.layer_types[layer] == "sliding_attention"

    def layer_window(self, layer: int) -> int | None:
        """The window `layer` attends within, or None where it cannot bind: positions stay
        below max_position_embeddings, so a window at least that wide masks nothing."""
        if not self.layer_slides(layer) or self.sliding_window >= self.max_position_embeddings:
            return None
        return self.sliding_window

    def layer_rope(self, layer: int) -> tuple[float, dict | None]:
        """(rope_theta, rope_scaling dict or None) of `layer`'s rotary embedding."""
        if self.rope_local_base_freq is not None and self.layer_slides(layer):
            return self.rope_local_base_freq, None
        return self.rope_theta, dict(self.rope_scaling) if self.rope_scaling else None

    @property
    def num_parameters(self) -> int:
        d, f, h = self.hidden_size, self.intermediate_size, self.resolved_head_dim
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        if self.model_type == "gpt2":
            # Two LayerNorms, q/k/v/o with biases, up/down with biases; learned positions.
            layer = 4 * d + 4 * (d * d + d) + 2 * d * f + f + d
            return self.num_hidden_layers * layer + embed + self.max_position_embeddings * d + 2 * d
        attn = d * h * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        if self.attention_bias:
            attn += h * (self.num_attention_heads + 2 * self.num_key_value_heads)
        if self.o_proj_bias:
            attn += d
        if self.model_type in QK_NORM_TYPES:
            attn += 2 * h
        if self.num_experts:  # experts and the router
            mlp = self.num_experts * (3 * d * f + d)
        else:
            mlp = 3 * d * f + (2 * f + d if self.mlp_bias else 0)
        norms = 4 * d if self.model_type in GEMMA_TYPES else 2 * d
        return self.num_hidden_layers * (attn + mlp + norms) + embed + d

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def _canonical_rope_scaling(scaling) -> tuple | None:
    """HF's rope_scaling (a dict, or pairs) -> its sorted (key, value) pairs, checked; None for none."""
    if scaling is None:
        return None
    items = dict(scaling.items() if isinstance(scaling, Mapping) else scaling)
    kind = items.get("rope_type")
    if kind not in ROPE_SCALING_KEYS:
        raise ValueError(
            f"rope_scaling rope_type {kind!r} is not supported; supported: default (rope_scaling=None), "
            + ", ".join(ROPE_SCALING_KEYS)
        )
    required, optional = ROPE_SCALING_KEYS[kind]
    missing = [key for key in required if items.get(key) is None]
    unknown = sorted(set(items) - {"rope_type", *required, *optional})
    if missing or unknown:
        raise ValueError(
            f"rope_scaling {kind!r} needs {', '.join(required)} (optional: {', '.join(optional) or 'none'}); "
            f"missing {missing}, unknown {unknown}"
        )
    if not items["factor"] >= 1:
        raise ValueError(f"rope_scaling factor must be >= 1, got {items['factor']}")
    return tuple(sorted((key, value) for key, value in items.items() if value is not None))
