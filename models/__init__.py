"""Model definitions. Installed as `specjax.models`."""

from .cache import KVCache, init_cache
from .config import ModelConfig
from .llama import forward, full_forward, graphdef, init_params

__all__ = ["KVCache", "ModelConfig", "forward", "full_forward", "graphdef", "init_cache", "init_params"]
