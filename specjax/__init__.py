"""specjax: speculative decoding you can measure.

The tree shows the architecture:
    engine/     what runs inside one jit: prompts, the shared loop pieces, plain decoding,
                the speculative round, sampling, acceptance rules, outputs
    drafters/   one file per way of proposing tokens, behind one interface (base.py)
    trees/      static token trees: the structure, multi-candidate acceptance, tuning
    io/         models in and out: Model, Hugging Face directories, tokenizer, presets
    training/   everything that updates params: data, training, distillation, runs
    bench/      `specjax bench`: experiments, timing, cost model, reports
    parallel/   meshes: sharded params, caches and rows across devices and hosts (jax.sharding)
    models/     the model definitions (specjax.models), pure (params, tokens, positions, cache)
"""

from specjax import distributed  # specjax.distributed.initialize(...): multi-host runs
from specjax.api import build_drafter, generate, init_state, prepare, state_output, step
from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.core.acceptance import AcceptanceRule, greedy_rule, rejection_sampling_rule
from specjax.core.loop import CacheConfig
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.core.state import DecodeState, LoopState, Plan, SpecPlan, SpecState
from specjax.drafters import (
    BlockHead,
    DraftContext,
    Drafter,
    DraftModel,
    Eagle,
    Fallback,
    LayerSkip,
    Medusa,
    ParallelDraft,
    PromptLookup,
    Proposal,
    load_drafter,
    make_drafter,
    save_drafter,
    target_fingerprint,
)
from specjax.engine.adaptive_policy import AdaptiveConfig
from specjax.engine.output import GenerationOutput, GenerationStats, PreparedGeneration
from specjax.engine.tune import measure_acceptance, tune_tree
from specjax.io.hf import save_model
from specjax.io.model import Model, init_model, logits
from specjax.io.presets import load_model
from specjax.io.sharding import shard_model
from specjax.io.shared_weights import save_model_sharing
from specjax.legacy import (
    init_speculative_state,
    prepare_generate,
    prepare_speculative_generate,
    speculative_generate,
    speculative_step,
)
from specjax.models import KVCache, ModelConfig, init_cache
from specjax.parallel import make_mesh
from specjax.trees import Tree
from specjax.version import __version__  # noqa: F401 (specjax.__version__)

__all__ = [
    "AcceptanceRule",
    "AdaptiveConfig",
    "BlockHead",
    "CacheConfig",
    "DecodeState",
    "DraftContext",
    "DraftModel",
    "Drafter",
    "Eagle",
    "Fallback",
    "GenerationConfig",
    "GenerationOutput",
    "GenerationStats",
    "KVCache",
    "LayerSkip",
    "LoopState",
    "Medusa",
    "Model",
    "ModelConfig",
    "ParallelDraft",
    "Plan",
    "PreparedGeneration",
    "PromptLookup",
    "Proposal",
    "SamplingConfig",
    "SpecPlan",
    "SpecState",
    "SpeculativeConfig",
    "Tree",
    "build_drafter",
    "distributed",
    "generate",
    "greedy_rule",
    "init_cache",
    "init_model",
    "init_speculative_state",
    "init_state",
    "load_drafter",
    "load_model",
    "logits",
    "make_drafter",
    "make_mesh",
    "measure_acceptance",
    "prepare",
    "prepare_generate",
    "prepare_speculative_generate",
    "probabilities",
    "rejection_sampling_rule",
    "save_drafter",
    "save_model",
    "save_model_sharing",
    "shard_model",
    "speculative_generate",
    "speculative_step",
    "state_output",
    "step",
    "target_fingerprint",
    "tune_tree",
]
