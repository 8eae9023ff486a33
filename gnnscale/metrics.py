"""Evaluation metrics on plain tensors: accuracy, binary and multi-label ROC-AUC, average precision, MRR (no
scikit-learn needed)."""

from __future__ import annotations

import torch
from torch import Tensor


def accuracy(logits: Tensor, labels: Tensor) -> float:
    """Fraction of rows of ``logits`` float [n, C] whose argmax equals ``labels`` int64 [n]."""
    if labels.numel() == 0:
        return float("nan")
    return (logits.argmax(-1) == labels).float().mean().item()


def roc_auc(scores: Tensor, labels: Tensor) -> float:
    """Area under the ROC curve of ``scores`` float [n] for binary ``labels`` int64 [n]: the Mann-Whitney
    U statistic with average ranks for ties, so it equals scikit-learn's ``roc_auc_score``.  NaN when
    only one class is present."""
    labels = labels.to(torch.bool)
    num_pos = int(labels.sum())
    num_neg = labels.numel() - num_pos
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    scores = scores.double()
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    # Average rank within each run of tied scores: ranks are 1-based positions in sorted order.
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    average_rank = ends - (counts.double() - 1) / 2
    ranks = torch.empty_like(scores)
    ranks[order] = average_rank[inverse]
    rank_sum = ranks[labels].sum().item()
    return (rank_sum - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg)


def average_precision(scores: Tensor, labels: Tensor) -> float:
    """Average precision of ``scores`` float [n] for binary ``labels``: ``sum_k (R_k - R_{k-1}) P_k`` over
    the distinct score thresholds, highest first (tied scores form one threshold), as scikit-learn's
    ``average_precision_score``.  NaN without positives."""
    labels = labels.to(torch.bool)
    num_pos = int(labels.sum())
    if num_pos == 0:
        return float("nan")
    order = torch.argsort(scores.double(), descending=True)
    sorted_scores, sorted_labels = scores.double()[order], labels[order]
    true_positives = torch.cumsum(sorted_labels.double(), 0)
    # The last position of every run of tied scores is where that threshold's counts are read.
    last_of_run = torch.ones_like(sorted_labels)
    last_of_run[:-1] = sorted_scores[1:] != sorted_scores[:-1]
    tp = true_positives[last_of_run]
    predicted = torch.nonzero(last_of_run).squeeze(1).double() + 1
    precision = tp / predicted
    recall = tp / num_pos
    previous = torch.cat([recall.new_zeros(1), recall[:-1]])
    return float(((recall - previous) * precision).sum())


def per_batch_average_precision(positive: Tensor, negative: Tensor, batch: Tensor) -> float:
    """TGN's AP: :func:`average_precision` of each batch's ``positive`` scores float [n] against its
    ``negative`` scores float [n] (``batch`` int [n]: the batch of positive ``i`` and of its negative),
    averaged over the batches present.  NaN without any."""
    order = torch.argsort(batch, stable=True)
    sizes = torch.unique_consecutive(batch[order], return_counts=True)[1].tolist()
    aps = [average_precision(torch.cat([p, n]), torch.cat([torch.ones_like(p), torch.zeros_like(n)]))
           for p, n in zip(positive[order].split(sizes), negative[order].split(sizes))]
    return sum(aps) / len(aps) if aps else float("nan")


def mean_reciprocal_rank(positive: Tensor, negatives: Tensor) -> float:
    """Mean of ``1 / rank`` of each ``positive`` score float [n] among itself and its row of ``negatives``
    float [n, K]; a tie counts half a place (the expected rank under random tie-breaking)."""
    if positive.numel() == 0:
        return float("nan")
    higher = (negatives > positive.unsqueeze(1)).sum(1).double()
    tied = (negatives == positive.unsqueeze(1)).sum(1).double()
    return float((1.0 / (1.0 + higher + tied / 2)).mean())


def multilabel_roc_auc(scores: Tensor, labels: Tensor) -> float:
    """Mean over the label columns of :func:`roc_auc` (OGB's ogbn-proteins metric): ``scores`` float [n, C],
    ``labels`` {0, 1} [n, C]; columns with one class only are left out.  NaN when every column is."""
    values = [roc_auc(scores[:, c], labels[:, c]) for c in range(labels.shape[1])]
    values = [v for v in values if v == v]
    return sum(values) / len(values) if values else float("nan")


METRICS = ("accuracy", "roc_auc", "multilabel_roc_auc")
"""What :func:`evaluate` computes: single-label accuracy, binary ROC-AUC, multi-label mean ROC-AUC."""


def evaluate(metric: str, logits: Tensor, labels: Tensor) -> float:
    """The dataset's ``metric`` (one of :data:`METRICS`) of ``logits`` against ``labels``."""
    if metric == "accuracy":
        return accuracy(logits, labels)
    if metric == "roc_auc":
        return roc_auc(torch.softmax(logits.float(), -1)[:, 1], labels)
    if metric == "multilabel_roc_auc":
        return multilabel_roc_auc(logits.float(), labels)
    raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
