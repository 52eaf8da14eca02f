"""Model hyper-parameters, named exactly as Hugging Face's `LlamaConfig` names them."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Static description of a Llama-family decoder.

    Frozen and hashable so it can be a static argument of `jax.jit`: two models with
    equal configs share compiled programs.
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

    def __post_init__(self):
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
        if self.resolved_head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.resolved_head_dim}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def num_parameters(self) -> int:
        d, f, h = self.hidden_size, self.intermediate_size, self.resolved_head_dim
        attn = d * h * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        if self.attention_bias:
            attn += h * (self.num_attention_heads + 2 * self.num_key_value_heads)
        layer = attn + 3 * d * f + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embed + d

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)
