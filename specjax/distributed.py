"""`specjax.distributed.initialize(...)`: multi-host runs (see specjax/parallel/distributed.py)."""

from specjax.parallel.distributed import initialize, is_coordinator, shutdown

__all__ = ["initialize", "is_coordinator", "shutdown"]
