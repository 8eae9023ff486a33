"""gnnscale: train graph neural networks on 1..N ranks with the same script.

The public API (docs/api.md)::

    import gnnscale as gs

    with gs.init() as world:                          # torchrun's job, or a world of one
        graph = gs.open_graph("parts/cora-2", world)  # this rank's share (or gs.Graph.from_arrays(...))
        loader = gs.NodeLoader(graph, graph.train_ids, fanouts=[10, 10], batch_size=512)
        model = world.wrap(MyModel(graph.feature_dim, 64, graph.num_classes))
        ...
        outputs = gs.layerwise_inference(graph, model)

Importing the package is cheap: the names below load their modules (and torch) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "init": "gnnscale.world", "World": "gnnscale.world",
    "Graph": "gnnscale.graph", "open_graph": "gnnscale.graph",
    "NodeLoader": "gnnscale.node_loader", "Batch": "gnnscale.node_loader",
    "CacheConfig": "gnnscale.sampling",
    "layerwise_inference": "gnnscale.inference", "NodeOutputs": "gnnscale.inference",
    "read_outputs": "gnnscale.inference",
    "Block": "gnnscale.batch", "MiniBatch": "gnnscale.batch",
    "GNN": "gnnscale.nn", "ModelConfig": "gnnscale.nn", "SAGEConv": "gnnscale.nn", "GCNConv": "gnnscale.nn",
    "GATConv": "gnnscale.nn",
    "spmm_mean": "gnnscale.nn.ops", "spmm_sum": "gnnscale.nn.ops",
    "csc_from_edges": "gnnscale.data.dataset", "load_dataset": "gnnscale.data.loaders",
    "Trainer": "gnnscale.train.trainer", "TrainConfig": "gnnscale.train.trainer", "Adam": "gnnscale.optim",
    "LinkLoader": "gnnscale.link_loader", "LinkBatch": "gnnscale.link_loader", "split_edges": "gnnscale.link_loader",
    "rank_share": "gnnscale.link_loader", "LinkTask": "gnnscale.link_task", "LinkMiniBatch": "gnnscale.batch",
    "DotDecoder": "gnnscale.nn", "MLPDecoder": "gnnscale.nn", "link_loss": "gnnscale.nn",
    "TemporalEvents": "gnnscale.data.temporal", "load_temporal": "gnnscale.data.temporal",
    "chronological_split": "gnnscale.data.temporal", "TemporalSplit": "gnnscale.data.temporal",
    "TemporalLinkTrainer": "gnnscale.temporal.train", "TemporalTrainConfig": "gnnscale.temporal.train",
    "TGN": "gnnscale.temporal", "TGNConfig": "gnnscale.temporal", "MemoryConfig": "gnnscale.temporal",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # Lazy: `python -m partition --help` and the CLIs' option checks must not pay for torch.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gnnscale' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
