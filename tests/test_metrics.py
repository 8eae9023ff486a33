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
