"""`specjax.distributed.initialize(...)`: multi-host runs (see specjax/parallel/multihost.py)."""

from specjax.parallel.multihost import initialize, is_coordinator, shutdown

__all__ = ["initialize", "is_coordinator", "shutdown"]
