"""Moving loaded batches to the training device, overlapped with compute.

On CUDA, batch ``i + 1`` is copied from its pinned host buffers on a side stream while the default stream
computes batch ``i``; the default stream waits on the copy's event only when it reaches batch ``i + 1``,
and the host slot is recycled only after that event.  With ``features_on_device`` the whole feature table
lives on the device: the loader gathers no rows, only ids (and block structure) cross the bus, and rows
are selected on the device.  On CPU everything is a no-op pass-through.

No DGL import here: a GPU machine whose torch cannot load DGL runs this on saved batches
(``scripts/gpu_pipeline_check.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from gnnscale.batch import MiniBatch
from gnnscale.pipeline.loader import LoadedBatch


@dataclass
class DeviceBatch:
    """A batch ready on the training device."""

    index: int
    batch: MiniBatch
    x: Tensor
    """float [num_input, F] input features on the device."""
    y: Tensor
    """Labels of the seeds, on the device."""

    @property
    def blocks(self) -> list:
        """The batch's blocks, input side first (:class:`~gnnscale.batch.Block`)."""
        return self.batch.blocks

    @property
    def seeds(self) -> Tensor:
        """int64 [batch]: global ids of the nodes whose outputs are wanted (``y``'s rows)."""
        return self.batch.seeds


class DeviceFeeder:
    """Turns a stream of :class:`LoadedBatch` es into :class:`DeviceBatch` es on ``device``.

    Args:
        device: the training device.
        device_features: the whole feature table already on ``device`` (then the loader should
            run with ``gather_features=False``), or None to copy each batch's gathered rows.
    """

    def __init__(self, device: torch.device | str, device_features: Tensor | None = None) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.device_features = device_features
        if device_features is not None and device_features.device != self.device:
            raise ValueError(f"device_features is on {device_features.device}, expected {self.device}")
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.copy_seconds = 0.0
        """Host time spent issuing copies (on CUDA the copies themselves run asynchronously)."""
        self.copied_bytes = 0

    def _issue(self, loaded: LoadedBatch) -> tuple[DeviceBatch, object]:
        start = time.perf_counter()
        if not self.cuda:
            x = loaded.x if self.device_features is None else torch.index_select(
                self.device_features, 0, loaded.batch.input_ids)
            result = DeviceBatch(index=loaded.index, batch=loaded.batch, x=x, y=loaded.y)
            self.copy_seconds += time.perf_counter() - start
            return result, None
        with torch.cuda.stream(self.stream):
            batch = loaded.batch.to(self.device, non_blocking=True)
            y = loaded.y.to(self.device, non_blocking=True)
            if self.device_features is None:
                x = loaded.x.to(self.device, non_blocking=True)
                self.copied_bytes += loaded.x.numel() * loaded.x.element_size()
            else:
                x = torch.index_select(self.device_features, 0, batch.input_ids)
            event = torch.cuda.Event()
            event.record(self.stream)
        loaded.release_after.append(event)
        self.copy_seconds += time.perf_counter() - start
        return DeviceBatch(index=loaded.index, batch=batch, x=x, y=y), event

    def _handover(self, item: DeviceBatch, event: object) -> DeviceBatch:
        if event is None:
            return item
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        # Allocated on the side stream: tell the allocator the default stream uses them too (no early reuse).
        for tensor in _tensors(item):
            tensor.record_stream(current)
        return item

    def __call__(self, loaded_batches: Iterable[LoadedBatch]) -> Iterator[DeviceBatch]:
        """Yield each batch on the device; on CUDA the next batch's copy is in flight meanwhile."""
        if not self.cuda:
            # Nothing to overlap on the CPU: the batch's tensors are the loader's buffers, used in place.
            for loaded in loaded_batches:
                yield self._issue(loaded)[0]
            return
        pending: tuple[DeviceBatch, object] | None = None
        for loaded in loaded_batches:
            issued = self._issue(loaded)
            if pending is not None:
                yield self._handover(*pending)
            pending = issued
        if pending is not None:
            yield self._handover(*pending)


def _tensors(item: DeviceBatch) -> Iterator[Tensor]:
    yield item.x
    yield item.y
    yield item.batch.seeds
    for block in item.batch.blocks:
        yield block.indptr
        yield block.indices
        yield block.src_ids
        for extra in (block.edge_weight, block.edge_ids, block.edge_attr):
            if extra is not None:
                yield extra
