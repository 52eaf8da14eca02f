"""Multi-host: one process per host (or per GPU), all of them running the same program.

`initialize` wraps `jax.distributed.initialize`. After it, `jax.devices()` lists the
devices of every process, `make_mesh` spans them, and a sharded generation is one SPMD
program that each process runs on its own devices; XLA moves the data between hosts
(NCCL on GPUs, ICI/DCN on TPUs, gloo on CPUs). Each process must make the same calls
with the same inputs (same prompts, same seeds), as with any multi-controller JAX program.

  GPU cluster (one process per node, SLURM or by hand):
      specjax.distributed.initialize("10.0.0.1:1234", num_processes=4, process_id=RANK)
      (under SLURM/Open MPI, `initialize()` with no arguments detects them)
  TPU pod slice: `initialize()` with no arguments on every host (the TPU runtime says who
      is who).
  CPU processes (tests, this machine): initialize("localhost:1234", 2, pid, cpu_collectives="gloo").
"""

from __future__ import annotations

import jax


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids=None,
    cpu_collectives: str | None = None,
    initialization_timeout: int = 300,
) -> None:
    """Join this process to a multi-process JAX run; call before anything touches a device.

    coordinator_address: "host:port" of process 0 (None: detected on TPU pods and under
      SLURM / Open MPI).
    cpu_collectives: "gloo" (or "mpi") to let CPU devices of different processes talk;
      XLA:CPU has no cross-process collectives without it. Must be set before the CPU
      backend starts, which is why it is an argument here and not a later step.
    """
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must lie in [0, {num_processes}), got {process_id}")
    if cpu_collectives is not None:
        if cpu_collectives not in ("gloo", "mpi"):
            raise ValueError(f"cpu_collectives must be 'gloo' or 'mpi', got {cpu_collectives!r}")
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        initialization_timeout=initialization_timeout,
    )


def shutdown() -> None:
    """Leave the multi-process run (also happens at exit)."""
    jax.distributed.shutdown()


def is_coordinator() -> bool:
    """True on process 0: the one that should write files and print reports."""
    return jax.process_index() == 0
