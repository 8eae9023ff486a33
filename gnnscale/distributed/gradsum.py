"""Gradients summed over ranks in buckets, each started while the backward is still running.

The parameters are cut into buckets of about :data:`BUCKET_BYTES`, in reverse order of registration
(the backward produces the last layers' gradients first).  Armed before the backward that ends a
gradient accumulation, :class:`GradientSum` counts each parameter's gradient as autograd finishes it
(a post-accumulate hook) and starts the asynchronous all-reduce of a bucket once all of its
parameters have theirs, and of every bucket before it: every rank starts the buckets in the same
order, whatever its own backward reaches first.  What the backward leaves (parameters without a
gradient on this rank) is started after it, with zeros and a has-a-gradient flag of 0, so a
parameter no rank has a gradient for keeps none, exactly as in one process.  Each element is the
same sum as one all-reduce of every gradient would give: only when it starts differs.

The temporal trainer arms it so that sums start during the backward; node classification's
``--grad-sync late`` starts them after the backward and waits for them a step later.
:class:`Replicated` (what ``World.wrap`` returns on several ranks) arms it in each forward and sets the
averaged gradients when the backward ends, as torch's ``DistributedDataParallel`` does, without DDP's
constructor, which imports torch's compiler (about 150 MiB a process).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from gnnscale.distributed.comm import Exchanger

BUCKET_BYTES = 1 << 19
"""About this many bytes of float32 gradients per bucket (the TGN of the docs: 3 buckets)."""


class GradientSum:
    """The gradient sums of ``params`` over the ranks of ``comm``: in the parameters' own dtype
    (``dtype="float32"``), or in ``bfloat16``.

    ``sparse``: the parameters whose gradients are sparse (sent as dense rows, set back sparse).
    """

    def __init__(self, params: list[nn.Parameter], comm: Exchanger, *, dtype: str = "float32",
                 sparse: tuple[nn.Parameter, ...] = ()) -> None:
        self.comm, self.dtype = comm, None if dtype == "float32" else getattr(torch, dtype)
        self.sparse = {id(p) for p in sparse}
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in reversed(params):
            if size >= BUCKET_BYTES:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * 4
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self._armed = False
        self._at_end: Callable[[], None] | None = None
        self._waiting: list[int] = []
        self._started: list[Callable[[], Tensor]] = []
        # Through a weak reference: a hook holding ``self`` would make parameter -> hook -> self -> parameter a
        # cycle that gc cannot see through (autograd's C++ nodes hold the parameters too), so this object and
        # its Exchanger's process group would live until the interpreter finalises -- where destroying a gloo
        # group hangs (gnnscale.distributed.shutdown).
        hook = _weak_hook(weakref.ref(self))
        for p in params:
            p.register_post_accumulate_grad_hook(hook)

    def arm(self, at_end: Callable[[], None] | None = None) -> None:
        """Start buckets during the next backward (the one ending an accumulation); ``at_end``, when given,
        runs once that backward has finished (queued with autograd's engine by the first gradient it makes)."""
        self._armed, self._waiting, self._started = True, [len(b) for b in self.buckets], []
        self._at_end = at_end

    def start_rest(self) -> Callable[[], None]:
        """Start every bucket not started yet (all of them when not armed); returns what waits for the
        sums and sets them as the parameters' gradients."""
        self._armed, self._at_end = False, None
        while len(self._started) < len(self.buckets):
            self._start(len(self._started))
        started, self._started = self._started, []

        def set_gradients() -> None:
            for bucket, finish in zip(self.buckets, started):
                total = finish().to(bucket[0].dtype)
                offset = 0
                for p, flag in zip(bucket, total[-len(bucket):].cpu().tolist()):
                    size = p.numel()
                    grad = total[offset:offset + size].view_as(p) if flag > 0 else None  # fresh each step
                    p.grad = grad.to_sparse(sparse_dim=1) if grad is not None and id(p) in self.sparse else grad
                    offset += size
        return set_gradients

    def _ready(self, p: nn.Parameter) -> None:
        if not self._armed:
            return
        if self._at_end is not None:
            torch.autograd.Variable._execution_engine.queue_callback(self._at_end)  # type: ignore[attr-defined]
            self._at_end = None
        self._waiting[self._bucket_of[id(p)]] -= 1
        while len(self._started) < len(self.buckets) and self._waiting[len(self._started)] == 0:
            self._start(len(self._started))

    def _start(self, index: int) -> None:
        bucket = self.buckets[index]
        # Every gradient (zeros where missing; a sparse one as dense rows), then one flag per parameter.
        flat = torch.cat([torch.zeros(p.numel(), dtype=p.dtype, device=p.device) if p.grad is None else
                          p.grad.to_dense().reshape(-1) if p.grad.is_sparse else p.grad.reshape(-1) for p in bucket] +
                         [torch.tensor([float(p.grad is not None) for p in bucket], dtype=bucket[0].dtype,
                                       device=bucket[0].device)])
        self._started.append(self.comm.all_reduce_start(flat if self.dtype is None else flat.to(self.dtype)))


def _weak_hook(owner: weakref.ref[GradientSum]) -> Callable[[nn.Parameter], None]:
    """A post-accumulate-grad hook calling ``owner()._ready`` while the :class:`GradientSum` lives."""
    def hook(p: nn.Parameter) -> None:
        live = owner()
        if live is not None:
            live._ready(p)
    return hook


class Replicated(nn.Module):
    """``module`` replicated over the ranks of ``comm``: rank 0's parameters and buffers at the start, its
    buffers again before every forward that records gradients, and every backward after such a forward
    leaves the gradients averaged over the ranks -- torch's ``DistributedDataParallel``'s contract
    (``module``, ``no_sync``, a ``state_dict`` under ``module.``), on :class:`GradientSum`'s buckets.

    Every rank must run the same forwards and backwards, as under DDP.  A parameter that no rank's backward
    reached keeps no gradient (DDP would stop with an error instead).
    """

    def __init__(self, module: nn.Module, comm: Exchanger) -> None:
        super().__init__()
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError(f"{type(module).__name__} has no parameter that requires a gradient, so there is "
                             f"nothing to average over the ranks; move it to the device without wrapping it")
        self.module = module
        self.gradients = GradientSum(params, comm)
        self._params, self._sync = params, True
        broadcast_from_rank0(comm, [*module.parameters(), *module.buffers()])
        self._at_end = _weak_call(weakref.ref(self), "_average")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and self._sync:
            buffers = list(self.module.buffers())
            if buffers:  # running statistics: rank 0's, as DDP's broadcast_buffers
                broadcast_from_rank0(self.gradients.comm, buffers)
            self.gradients.arm(self._at_end)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside keep their gradients on this rank (accumulated); the first backward after a
        forward outside averages the accumulated gradients, as DDP's ``no_sync``."""
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    def _average(self) -> None:
        self.gradients.start_rest()()
        scale = 1.0 / self.gradients.comm.world_size
        for p in self._params:
            if p.grad is not None:
                p.grad.mul_(scale)


def _weak_call(owner: weakref.ref[Any], name: str) -> Callable[[], None]:
    """``owner().name()`` while the owner lives (a bound method would keep it alive from autograd's hooks)."""
    def call() -> None:
        live = owner()
        if live is not None:
            getattr(live, name)()
    return call


def broadcast_from_rank0(comm: Exchanger, tensors: list[Tensor]) -> None:
    """Rank 0's values of ``tensors`` on every rank: one broadcast per dtype, on the tensors' device (the
    gradient group's: gloo on CPU, NCCL on CUDA).  The dtypes go in the order of their names: a set of them
    iterates in an order that may differ from process to process, and each rank must send the same one."""
    for dtype in sorted({t.dtype for t in tensors}, key=str):
        same = [t for t in tensors if t.dtype == dtype]
        flat = comm.broadcast(torch.cat([t.detach().reshape(-1) for t in same]), 0)
        with torch.no_grad():
            for t, values in zip(same, flat.split([t.numel() for t in same]), strict=True):
                t.copy_(values.view_as(t))
