"""The trainer's process group and the per-rank collectives a step uses.

Owns how a trainer process joins a world (``init_single_process_distributed``: a world of
one when no launcher set ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, gloo
without DeepSpeed's shared-memory op on CPU) and :class:`Ranks`, the few collectives the
trainer builds its steps from: this rank's contiguous shard of rows, the per-sample
values it owns, the common pass count (a MAX all-reduce), ``all_gather``, per-key sums
over ranks and the barrier. Every one is a no-op (or the local value) in a world of one.

It does not know what a sample, a loss or a DeepSpeed engine is: callers decide what to
shard and what to gather.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch

__all__ = ["Ranks", "init_single_process_distributed"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_distributed(backend: str, timeout_s: float = 300.0) -> None:
    """Make a world of one when no launcher set the usual env vars (a launcher's
    ``RANK``/``WORLD_SIZE``/``MASTER_*`` win), then init DeepSpeed's process group
    (idempotent). ``timeout_s`` bounds every collective: a rank whose peer died without
    closing its sockets fails after it instead of hanging."""
    import datetime

    import deepspeed
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    if os.environ.get("WORLD_SIZE", "1") == "1" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        # A world of one meets no peer, so its store takes a fresh port whatever an inherited
        # environment names: a parent that trained in-process leaves its own, still-bound
        # MASTER_PORT there, and reusing it fails with EADDRINUSE on every restart. Not under
        # torch's launcher (even with one process): its agent serves the store at the
        # MASTER_PORT it exported, and a fresh port would make the rank a client of no server.
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
    if backend == "gloo":
        _skip_shm_collectives()
    deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=datetime.timedelta(seconds=timeout_s))


def _skip_shm_collectives() -> None:
    """DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op
    (``deepspeed_shm_comm``) when its process group starts: a C++ build of a minute or more
    on a fresh machine or checkout, on the critical path to the first trained step. The op
    serves DeepSpeed's inference all-reduce only; training collectives go through
    torch.distributed's gloo ones whether it exists or not, so the trainer does without it."""
    import importlib

    # By module path: the attribute ``deepspeed.comm.torch`` is the torch package itself.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


@dataclass(frozen=True)
class Ranks:
    """This process's place in the world (``rank`` of ``world``) and the collectives over
    it; ``device`` is where collective tensors live (NCCL needs them on the GPU)."""

    rank: int
    world: int
    device: torch.device

    def shard(self, rows: list[int]) -> list[int]:
        """This rank's contiguous slice of ``rows`` (all of them in a world of one)."""
        n = len(rows)
        return rows[self.rank * n // self.world:(self.rank + 1) * n // self.world]

    def own(self, values: list) -> list:
        """``values`` (one per sample) with the entries outside this rank's shard of the
        batch set to None, so per-sample sums over ranks count every sample once."""
        mine = set(self.shard(list(range(len(values)))))
        return [v if i in mine else None for i, v in enumerate(values)]

    def common_count(self, n: int) -> int:
        """The largest ``n`` over ranks: how many passes every rank makes so that all of
        them enter the same collectives."""
        if self.world == 1:
            return n
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def all_gather(self, obj):
        """Every rank's ``obj``, in rank order (``[obj]`` in a world of one)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def sum_over_ranks(self, sums: dict[str, float]) -> dict[str, float]:
        """Per-key sums over ranks (a rank without samples reports fewer keys)."""
        total: dict[str, float] = {}
        for part in self.all_gather(sums):
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def barrier(self) -> None:
        """Wait for every rank (nothing in a world of one)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()
