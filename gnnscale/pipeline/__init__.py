"""The CPU-to-device mini-batch pipeline: prefetching loader, device transfer, allocator tuning."""

from gnnscale.pipeline.allocator import freed_memory_returned, keep_freed_memory, limit_arenas
from gnnscale.pipeline.loader import (LoadedBatch, LoaderConfig, PassStats, PrefetchLoader, batch_rng, epoch_order,
                                      split_batches)

__all__ = ["LoadedBatch", "LoaderConfig", "PassStats", "PrefetchLoader", "batch_rng", "epoch_order",
           "freed_memory_returned", "keep_freed_memory", "limit_arenas", "split_batches"]
