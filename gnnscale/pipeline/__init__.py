"""The CPU-to-device mini-batch pipeline: prefetching loader, device transfer, allocator tuning."""

from gnnscale.pipeline.allocator import keep_freed_memory, limit_arenas, trimmed_heap
from gnnscale.pipeline.loader import (LoadedBatch, LoaderConfig, PassStats, PrefetchLoader, batch_rng, epoch_order,
                                      split_batches)

__all__ = ["LoadedBatch", "LoaderConfig", "PassStats", "PrefetchLoader", "batch_rng", "epoch_order",
           "keep_freed_memory", "limit_arenas", "split_batches", "trimmed_heap"]
