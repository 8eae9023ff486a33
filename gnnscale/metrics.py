"""Evaluation metrics on plain tensors: accuracy, binary and multi-label ROC-AUC, average precision, MRR, Hits@K
(no scikit-learn needed)."""

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


def link_ranks(positive: Tensor, negatives: Tensor) -> Tensor:
    """float64 [n] rank of each ``positive`` score among negatives, ties counted half a place (OGB's mean of
    the optimistic and pessimistic ranks).  ``negatives`` float [n, K]: each positive against its own row
    (ogbl-citation2); float [K]: every positive against one shared set (ogbl-collab, -ppa, -ddi)."""
    positive = positive.double()
    if negatives.dim() == 2:
        higher = (negatives.double() > positive.unsqueeze(1)).sum(1).double()
        tied = (negatives.double() == positive.unsqueeze(1)).sum(1).double()
    else:
        ordered = torch.sort(negatives.double()).values
        below = torch.searchsorted(ordered, positive, right=False)
        not_above = torch.searchsorted(ordered, positive, right=True)
        higher = (ordered.numel() - not_above).double()
        tied = (not_above - below).double()
    return 1.0 + higher + tied / 2


def mean_reciprocal_rank(positive: Tensor, negatives: Tensor) -> float:
    """Mean of ``1 / rank`` of each ``positive`` score float [n] among its negatives (:func:`link_ranks`:
    a row of ``negatives`` float [n, K] per positive, or one shared float [K] set).  NaN without positives."""
    if positive.numel() == 0:
        return float("nan")
    return float((1.0 / link_ranks(positive, negatives)).mean())


def hits_at_k(positive: Tensor, negatives: Tensor, k: int) -> float:
    """OGB's Hits@K of ``positive`` scores float [n].  Shared ``negatives`` float [M] (ogbl-collab/ppa/ddi): the
    fraction of positives scoring strictly above the K-th highest negative (all of them when there are fewer
    than K negatives).  Per-positive ``negatives`` float [n, K'] (ogbl-citation2): the fraction whose
    :func:`link_ranks` rank is at most K.  NaN without positives."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if positive.numel() == 0:
        return float("nan")
    if negatives.dim() == 2:
        return float((link_ranks(positive, negatives) <= k).double().mean())
    if negatives.numel() < k:
        return 1.0
    kth = torch.topk(negatives.double(), k).values[-1]
    return float((positive.double() > kth).double().mean())


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
