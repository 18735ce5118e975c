"""Data-parallel runs through accelerate's process state: one model copy per process, examples sharded.

``accelerate launch --multi_gpu --num_processes N -m cwviz ...`` or ``torchrun --nproc_per_node N -m cwviz ...``
start N processes with the usual environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``);
:func:`processes` reads it through :class:`accelerate.PartialState`, which sets up the process group (NCCL on
GPUs, gloo on the CPU). Without a launcher it is one process, as before. On a machine without CUDA the state
is made with ``cpu=True``: accelerate only forms a CPU (gloo) group when asked to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .settings import world_size


@dataclass(frozen=True)
class Processes:
    """This process's place in a data-parallel run: ``index`` of ``count``; ``device`` its own device."""

    index: int = 0
    count: int = 1
    device: str | None = None  # None: the caller's choice (single process)

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def barrier(self) -> None:
        """Wait for every process (nothing to wait for in a single process)."""
        if self.count > 1:
            from accelerate import PartialState

            PartialState().wait_for_everyone()


def processes(device: str = "auto") -> Processes:
    """The process state of this run; under a launcher, each process gets its own device (``cuda:LOCAL_RANK``)."""
    if world_size() <= 1:  # InputError for a WORLD_SIZE no launcher set
        return Processes()
    from accelerate import PartialState

    cpu = device == "cpu" or not torch.cuda.is_available()
    state = PartialState(cpu=cpu)
    return Processes(state.process_index, state.num_processes, "cpu" if cpu else str(state.device))


def shard(items: Sequence, index: int, count: int) -> list:
    """Process ``index``'s share of ``items`` (round robin, so long and short examples spread evenly)."""
    return list(items[index::count])
