"""specjax: speculative decoding you can measure."""

from specjax.decode import DecodeState, generate, prepare_generate
from specjax.hf import load_model, save_model
from specjax.model import Model, init_model, logits
from specjax.models import KVCache, ModelConfig, init_cache
from specjax.output import GenerationOutput, GenerationStats, PreparedGeneration
from specjax.sampling import (
    AcceptanceRule,
    SamplingConfig,
    greedy_rule,
    probabilities,
    rejection_sampling_rule,
)
from specjax.speculative import (
    SpecPlan,
    SpecState,
    init_speculative_state,
    prepare_speculative_generate,
    speculative_generate,
    speculative_step,
    state_output,
)

__version__ = "0.1.0"

__all__ = [
    "AcceptanceRule",
    "DecodeState",
    "GenerationOutput",
    "GenerationStats",
    "KVCache",
    "Model",
    "ModelConfig",
    "PreparedGeneration",
    "SamplingConfig",
    "SpecPlan",
    "SpecState",
    "generate",
    "greedy_rule",
    "init_cache",
    "init_model",
    "init_speculative_state",
    "load_model",
    "logits",
    "prepare_generate",
    "prepare_speculative_generate",
    "probabilities",
    "rejection_sampling_rule",
    "save_model",
    "speculative_generate",
    "speculative_step",
    "state_output",
]
