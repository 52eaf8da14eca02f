"""Model hyper-parameters, named exactly as Hugging Face's `LlamaConfig` names them."""

from __future__ import annotations

import dataclasses

# The architectures a ModelConfig can describe. "qwen2" and "mistral" run the Llama code
# (they differ only in which biases exist); the name picks the HF class a save writes.
LLAMA_FAMILY = ("llama", "qwen2", "mistral")
MODEL_TYPES = (*LLAMA_FAMILY, "gpt2")


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
      model_type: "llama", "qwen2", "mistral" (models/llama.py) or "gpt2" (models/gpt2.py).
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
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    head_dim: int | None = None
    dtype: str = "float32"
    o_proj_bias: bool = False
    mlp_bias: bool = False
    model_type: str = "llama"

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"ModelConfig.model_type must be one of {', '.join(MODEL_TYPES)}, got {self.model_type!r}")
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
        if self.model_type == "gpt2":
            self._check_gpt2()
        else:
            self._check_llama_family()

    def _check_llama_family(self):
        if self.resolved_head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.resolved_head_dim}")
        # The HF classes of these two types have fixed biases; a save must be able to say so.
        if self.model_type == "qwen2" and (not self.attention_bias or self.o_proj_bias or self.mlp_bias):
            raise ValueError(
                "model_type 'qwen2' means q/k/v biases only: attention_bias=True, o_proj_bias=False, mlp_bias=False"
            )
        if self.model_type == "mistral" and (self.attention_bias or self.o_proj_bias or self.mlp_bias):
            raise ValueError(
                "model_type 'mistral' has no biases: attention_bias, o_proj_bias and mlp_bias must be False"
            )

    def _check_gpt2(self):
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
        mlp = 3 * d * f + (2 * f + d if self.mlp_bias else 0)
        layer = attn + mlp + 2 * d
        return self.num_hidden_layers * layer + embed + d

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)
