"""``World.wrap`` on real gloo ranks: DistributedDataParallel's contract without DDP (and its compiler import)."""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
import torch
from torch import nn

from distributed_helpers import run_ranks


class Net(nn.Module):
    """Two layers with a batch norm between, and a layer the forward never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.norm, self.last = nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)
        self.unused = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.relu(self.norm(self.first(x))))


def local_grads(module: nn.Module, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The gradients this rank alone accumulates over ``batches`` (a copy of ``module``, no ranks)."""
    alone = copy.deepcopy(module)
    for x in batches:
        alone(x).square().mean().backward()
    return {n: p.grad.clone() for n, p in alone.named_parameters() if p.grad is not None}


def train_wrapped(rank: int) -> dict[str, Any]:
    import gnnscale as gs
    from gnnscale.distributed.gradsum import Replicated

    torch.manual_seed(rank)  # every rank builds different weights and statistics
    net = Net()
    net.norm.running_mean.fill_(float(rank + 1))
    x1, x2, x3 = (torch.randn(16, 4, generator=torch.Generator().manual_seed(10 * rank + i)) for i in range(3))
    with gs.init() as world:
        model = world.wrap(net)
        out: dict[str, Any] = {"type": type(model).__name__, "keys": sorted(model.state_dict()),
                               "start": {k: v.clone() for k, v in model.module.state_dict().items()},
                               "decoder": type(world.wrap(nn.Identity())).__name__}
        assert isinstance(model, Replicated)
        expected_one = local_grads(model.module, [x1])
        model(x1).square().mean().backward()
        out["one"] = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
        out["local_one"] = expected_one
        model.module.zero_grad(set_to_none=True)

        expected_two = local_grads(model.module, [x2, x3])
        with model.no_sync():
            model(x2).square().mean().backward()
        out["after_no_sync"] = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
        model(x3).square().mean().backward()
        out["two"] = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
        out["local_two"] = expected_two
        with torch.no_grad():
            model(x1)  # no gradients recorded: no collective, no sum armed
        out["compiler_loaded"] = "torch._dynamo" in sys.modules
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return run_ranks(train_wrapped, 2, timeout=180.0)


def test_every_rank_starts_from_rank_0s_weights_and_buffers(runs: list[dict[str, Any]]) -> None:
    zero, one = runs
    assert zero["type"] == one["type"] == "Replicated"
    assert all(key.startswith("module.") for key in zero["keys"])  # DDP's checkpoint layout
    for name, value in zero["start"].items():
        assert torch.equal(value, one["start"][name]), name
    assert torch.equal(zero["start"]["norm.running_mean"], torch.ones(8))
    assert zero["decoder"] == "Identity"  # nothing to train: the module itself


def test_a_backward_leaves_the_average_of_the_ranks_gradients(runs: list[dict[str, Any]]) -> None:
    zero, one = runs
    assert set(zero["one"]) == {n for n in zero["local_one"]}
    assert not any(name.startswith("unused.") for name in zero["one"])  # no rank's backward reached it
    for name, local in zero["local_one"].items():
        mean = (local + one["local_one"][name]) / 2
        torch.testing.assert_close(zero["one"][name], mean, rtol=1e-6, atol=1e-7)
        assert torch.equal(zero["one"][name], one["one"][name]), name
    assert not torch.allclose(zero["local_one"]["first.weight"], one["local_one"]["first.weight"])


def test_no_sync_accumulates_locally_and_the_next_backward_averages_the_accumulation(
        runs: list[dict[str, Any]]) -> None:
    zero, one = runs
    assert not torch.equal(zero["after_no_sync"]["first.weight"], one["after_no_sync"]["first.weight"])
    for name, local in zero["local_two"].items():
        torch.testing.assert_close(zero["two"][name], (local + one["local_two"][name]) / 2, rtol=1e-6, atol=1e-7)
        assert torch.equal(zero["two"][name], one["two"][name]), name


def test_wrapping_does_not_load_torchs_compiler(runs: list[dict[str, Any]]) -> None:
    assert not any(run["compiler_loaded"] for run in runs)


def test_a_module_without_parameters_to_train_is_refused_in_one_line() -> None:
    from gnnscale.distributed.comm import Exchanger
    from gnnscale.distributed.gradsum import Replicated

    with pytest.raises(ValueError, match="Identity has no parameter that requires a gradient.*without wrapping it"):
        Replicated(nn.Identity(), Exchanger(None, 0, 1))
