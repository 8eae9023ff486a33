"""How long a step's backward waits on the gradient sum: the exposed part of DDP's all-reduce.

DDP starts a bucket's all-reduce once autograd has produced its gradients and the backward
returns only when every bucket is summed.  :class:`GradSumClock` is a DDP communication hook that
notes when the last bucket was handed over (then all-reduces it exactly as DDP's default does:
divided by the world size, summed), so the time from there to the backward's return is the part
of the sum no computation hid: the network, and waiting for the slowest rank.  The trainer
reports it per epoch (``grad_wait_s``) and ``--rank-capacity auto`` subtracts it from a step's
time to get what the rank itself spent (:meth:`gnnscale.train.shares.SeedShares.rebalance`).
Times are the host's: on CUDA, where kernels run asynchronously, the hand-over is when the host
queued the bucket, so the wait also holds the device's unfinished backward.
"""

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel


class GradSumClock:
    """Registered on ``model`` (a DDP module) at construction; :meth:`exposed` after each backward."""

    def __init__(self, model: DistributedDataParallel, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.ready = 0.0
        model.register_comm_hook(self, GradSumClock._hook)

    @staticmethod  # real annotations (no ``from __future__ import annotations``): DDP compares them
    def _hook(clock: "GradSumClock", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        clock.ready = time.perf_counter()
        return allreduce_hook(clock.group, bucket)

    def exposed(self, backward_start: float) -> float:
        """Seconds from the last bucket's hand-over (of the backward begun at ``backward_start``) to now."""
        return max(0.0, time.perf_counter() - max(self.ready, backward_start))
