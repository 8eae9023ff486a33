import math

import pytest
import torch

from gnnscale.metrics import accuracy, evaluate, roc_auc


def brute_force_auc(scores, labels):
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return ((diff > 0).double() + 0.5 * (diff == 0).double()).mean().item()


def test_roc_auc_matches_pairwise_definition_with_ties():
    torch.manual_seed(0)
    scores = torch.randint(0, 5, (300,)).float()  # many ties
    labels = (torch.rand(300) < 0.3).long()
    assert roc_auc(scores, labels) == pytest.approx(brute_force_auc(scores, labels), abs=1e-12)


def test_roc_auc_extremes_and_single_class():
    labels = torch.tensor([0, 0, 1, 1])
    assert roc_auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert roc_auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert torch.isnan(torch.tensor(roc_auc(torch.rand(4), torch.ones(4, dtype=torch.long))))


def test_accuracy_and_unknown_metric():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0]])
    assert accuracy(logits, torch.tensor([0, 1, 1])) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        evaluate("f1", logits, torch.tensor([0, 1, 1]))


def test_average_precision_matches_a_brute_force_definition():
    from gnnscale.metrics import average_precision

    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        n = 30
        scores = torch.randint(0, 8 if trial % 2 else 1000, (n,), generator=generator).float()  # ties on odd trials
        labels = torch.randint(0, 2, (n,), generator=generator)
        labels[0] = 1
        # Brute force: walk the distinct thresholds from the top; precision and recall at each.
        expected, previous_recall = 0.0, 0.0
        for threshold in sorted(set(scores.tolist()), reverse=True):
            chosen = scores >= threshold
            tp = int((chosen & labels.bool()).sum())
            recall = tp / int(labels.sum())
            expected += (recall - previous_recall) * tp / int(chosen.sum())
            previous_recall = recall
        assert average_precision(scores, labels) == pytest.approx(expected)
    assert average_precision(torch.tensor([0.9, 0.8, 0.1]), torch.tensor([1, 1, 0])) == 1.0
    assert average_precision(torch.tensor([0.1, 0.8]), torch.tensor([1, 0])) == pytest.approx(0.5)
    assert math.isnan(average_precision(torch.tensor([0.3]), torch.tensor([0])))


def test_mean_reciprocal_rank():
    from gnnscale.metrics import mean_reciprocal_rank

    positive = torch.tensor([0.9, 0.5, 0.2])
    negatives = torch.tensor([[0.1, 0.2], [0.6, 0.1], [0.3, 0.2]])
    # ranks: 1, 2, and 2.5 (one higher, one tied)
    assert mean_reciprocal_rank(positive, negatives) == pytest.approx((1 + 1 / 2 + 1 / 2.5) / 3)


def test_strict_json_writes_null_and_the_reason_for_numbers_json_cannot_hold(tmp_path):
    from conftest import read_strict_json
    from gnnscale.train.cli import write_json_atomic

    write_json_atomic(tmp_path / "m.json", {"val": float("-inf"), "test": roc_auc(torch.rand(4), torch.ones(4)),
                                            "history": [{"loss": float("nan")}, {"loss": 0.5}], "epochs": 2})
    data = read_strict_json(tmp_path / "m.json")  # raises on NaN / Infinity
    assert data["val"] is None and data["test"] is None and data["history"] == [{"loss": None}, {"loss": 0.5}]
    assert sorted(data["not_computed"]) == ["history[0].loss", "test", "val"]
    assert "ROC-AUC over one class" in data["not_computed"]["test"] and data["epochs"] == 2
