"""Many processes for ``fxlrp explain --data``, on torch's own engine: ``torchrun`` starts them and
sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
:func:`processes_from_environment` joins the process group from that environment (``gloo`` on
the CPU, ``nccl`` on CUDA), so the same command runs on one machine or several with torchrun's
rendezvous options.

Work is split by shard, not by sample: the shards still to compute are dealt out in turn
(:meth:`Processes.share`), the way ``DistributedSampler`` deals out samples, but without its
padding: no shard twice, none lost, and where the shards do not divide evenly some processes get
one more. Since shard ``k`` holds the same samples whoever computes it, the files do not depend
on the number of processes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch

Item = TypeVar("Item")


@dataclass
class Processes:
    """This process's place among those started together: ``rank`` of ``world_size``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    joined: bool = False
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, work: Sequence[Item]) -> list[Item]:
        """This process's part of ``work``: items ``rank, rank + world_size, ...`` (every item
        goes to exactly one process)."""
        return list(work[self.rank::self.world_size])

    def barrier(self) -> None:
        """Wait for every process (nothing to wait for when alone)."""
        if not self.joined:
            return
        import torch.distributed as dist

        try:
            if self.backend == "nccl":
                dist.barrier(device_ids=[self.local_rank])
            else:
                dist.barrier()
        except Exception:  # noqa: BLE001 - a peer that ended (its own error says why) breaks the barrier
            print(f"fxlrp: process {self.rank} of {self.world_size} stops: another process failed (its message is "
                  f"above)", file=sys.stderr)
            raise SystemExit(1) from None

    def close(self) -> None:
        """Leave the process group."""
        if self.joined:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.joined = False


def launched_by_torchrun() -> bool:
    """Whether the environment describes a process group (``torchrun`` sets these variables)."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def processes_from_environment(device_type: str, timeout: timedelta = timedelta(hours=2)) -> Processes:
    """Join the process group torchrun describes (``gloo`` for the CPU, ``nccl`` for CUDA), or,
    started any other way, a lone process. ``timeout``: how long a barrier waits for the others
    (the last shards of a data set can take a while)."""
    if not launched_by_torchrun():
        return Processes()
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timeout)
    return Processes(rank, world_size, local_rank, True, backend)
