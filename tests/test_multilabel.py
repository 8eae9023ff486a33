"""Multi-label node classification: 0/1 labels [N, L], binary cross entropy per label, mean ROC-AUC; through
the dataset, the partition folder and the trainer, on 1 and 2 ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from distributed_helpers import partition_dataset, run_ranks


def multilabel_dataset() -> Any:
    """The planted-community graph with L = C + 1 labels per node: its community (one-hot), and whether a
    third or more of its in-neighbours lie in community 0 (a label only the structure tells)."""
    from gnnscale.data.dataset import GraphDataset
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

    base = generate_synthetic(SyntheticConfig(num_nodes=1500, avg_degree=8, num_classes=4, feat_dim=16, seed=3))
    src, degree = base.indices, np.diff(base.indptr)
    in_zero = np.add.reduceat((base.labels[src] == 0).astype(np.float64), base.indptr[:-1]) * (degree > 0)
    structural = in_zero >= np.maximum(degree, 1) / 3
    labels = np.concatenate([np.eye(4, dtype=np.int64)[base.labels], structural[:, None].astype(np.int64)], 1)
    return GraphDataset(name="multilabel", indptr=base.indptr, indices=base.indices, features=base.features,
                        labels=labels, train_masks=base.train_masks, val_masks=base.val_masks,
                        test_masks=base.test_masks, num_classes=5, metric="multilabel_roc_auc")


def train(rank: int, parts: str) -> float:
    import gnnscale as gs
    from gnnscale.train.trainer import TrainConfig
    from samplers import SamplerConfig

    with gs.init() as world:
        graph = gs.open_graph(parts, world)
        assert graph.labels.shape == (graph.num_owned, 5) and graph.num_classes == 5
        trainer = gs.Trainer(graph, model_config=gs.ModelConfig(num_layers=2, hidden=32),
                             sampler_config=SamplerConfig(fanouts=[8, 8]),
                             config=TrainConfig(epochs=8, batch_size=128, lr=0.01, num_workers=0))
        return trainer.fit().test


@pytest.mark.parametrize("ranks", [1, 2])
def test_multilabel_trains_from_a_partition_folder(tmp_path: Path, ranks: int) -> None:
    parts = partition_dataset(multilabel_dataset(), tmp_path / "parts", ranks)
    scores = run_ranks(train, ranks, str(parts), timeout=300.0)
    # Chance is 0.5; every rank reports the same mean ROC-AUC over the 5 labels.
    assert scores[0] == scores[-1] > 0.8, scores


def test_multilabel_metric_is_the_mean_over_labels() -> None:
    from gnnscale.metrics import evaluate, roc_auc

    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.1, 0.6]])
    labels = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0]])
    expected = (roc_auc(scores[:, 0], labels[:, 0]) + roc_auc(scores[:, 1], labels[:, 1])) / 2
    assert evaluate("multilabel_roc_auc", scores, labels) == pytest.approx(expected)
    # A label with one class only has no ROC-AUC: it is left out of the mean.
    assert evaluate("multilabel_roc_auc", scores, torch.tensor([[1, 1], [0, 1], [1, 1], [0, 1]])) == 1.0


def test_bad_multilabels_are_refused() -> None:
    from gnnscale.data.dataset import DatasetError, GraphDataset

    data = multilabel_dataset()
    fields = dict(name="bad", indptr=data.indptr, indices=data.indices, features=data.features,
                  train_masks=data.train_masks, val_masks=data.val_masks, test_masks=data.test_masks,
                  metric="multilabel_roc_auc")
    with pytest.raises(DatasetError, match=r"expected shape \[1500, 6\] for a multi-label task, got \[1500, 5\]"):
        GraphDataset(labels=data.labels, num_classes=6, **fields)
    with pytest.raises(DatasetError, match="multi-label targets must be 0 or 1, found 2"):
        GraphDataset(labels=data.labels * 2, num_classes=5, **fields)
