"""specjax: speculative decoding you can measure.

The top level is what a user of `generate` needs: the entry points, the two settings
objects and the types nested in them, the output, models and drafters in and out, meshes.
Everything else is reached through the module it lives in (`specjax.drafters.Medusa`,
`specjax.core.acceptance.greedy_rule`, `specjax.core.state.LoopState`, ...); a name that
left the top level raises an AttributeError that names its module.

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

from specjax import distributed  # noqa: F401 (specjax.distributed.initialize(...): multi-host runs)
from specjax.api import generate, init_state, load_drafter, prepare, state_output, step
from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.constraints import Constraint
from specjax.core.loop import CacheConfig
from specjax.drafters import Drafter, save_drafter
from specjax.engine.adaptive_policy import AdaptiveConfig
from specjax.engine.output import GenerationOutput
from specjax.engine.verify_schedule import VerifySchedule
from specjax.io.hf import save_model
from specjax.io.model import Model, init_model
from specjax.io.presets import load_model
from specjax.io.sharding import shard_model

# The entry points before GenerationConfig work for one release, each with a
# DeprecationWarning saying what to write instead; they are not in __all__.
from specjax.legacy import (  # noqa: F401
    init_speculative_state,
    prepare_generate,
    prepare_speculative_generate,
    speculative_generate,
    speculative_step,
)
from specjax.models import ModelConfig
from specjax.parallel import make_mesh
from specjax.trees import Tree
from specjax.version import __version__  # noqa: F401 (specjax.__version__)

__all__ = [
    "AdaptiveConfig",
    "CacheConfig",
    "Constraint",
    "Drafter",
    "GenerationConfig",
    "GenerationOutput",
    "Model",
    "ModelConfig",
    "SpeculativeConfig",
    "Tree",
    "VerifySchedule",
    "generate",
    "init_model",
    "init_state",
    "load_drafter",
    "load_model",
    "make_mesh",
    "prepare",
    "save_drafter",
    "save_model",
    "shard_model",
    "state_output",
    "step",
]

# Names the top level exported before it was narrowed, by the module each lives in now.
_MOVED_TO = {
    "specjax.core.acceptance": "AcceptanceRule greedy_rule rejection_sampling_rule",
    "specjax.core.sampling": "SamplingConfig probabilities",
    "specjax.core.state": "LoopState DecodeState SpecState Plan SpecPlan",
    "specjax.drafters": "BlockHead DraftContext DraftModel Eagle Fallback LayerSkip Medusa ParallelDraft "
    "PromptLookup Proposal make_drafter target_fingerprint",
    "specjax.engine.output": "GenerationStats PreparedGeneration",
    "specjax.engine.tune": "measure_acceptance tune_tree",
    "specjax.io.model": "logits",
    "specjax.io.shared_weights": "save_model_sharing",
    "specjax.models": "KVCache init_cache",
}
_MOVED = {name: module for module, names in _MOVED_TO.items() for name in names.split()}
# Names exported before whose job another call does now.
_REPLACED = {"build_drafter": "specjax.load_drafter(speculative, target)"}


def __getattr__(name: str):
    # Only called for names the module does not have (PEP 562): a moved name fails loudly,
    # with the import that replaces it, instead of a bare "has no attribute".
    if name in _MOVED:
        module = _MOVED[name]
        raise AttributeError(f"specjax.{name} is no longer at the top level: use `from {module} import {name}`")
    if name in _REPLACED:
        raise AttributeError(f"specjax.{name} is gone: use {_REPLACED[name]}")
    raise AttributeError(f"module 'specjax' has no attribute {name!r}")
