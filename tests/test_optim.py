"""gnnscale's Adam against torch's, and a trainer that never loads torch's compiler."""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from gnnscale.optim import Adam


def _models(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3), nn.Linear(3, 2))
    twin = nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3), nn.Linear(3, 2))
    twin.load_state_dict(model.state_dict())
    return model, twin


def _train(model: nn.Module, optimizer, steps: range, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for step in steps:
        x = torch.randn(16, 7, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        # every third step leaves the last layer without a gradient: its state must not move
        head = model[:3] if step % 3 == 2 else model
        head(x).square().mean().backward()
        optimizer.step()


@pytest.mark.parametrize("weight_decay", [0.0, 5e-4])
def test_adam_equals_torchs_bit_for_bit(weight_decay):
    ours, theirs = _models()
    a = Adam(ours.parameters(), lr=0.01, weight_decay=weight_decay)
    b = torch.optim.Adam(theirs.parameters(), lr=0.01, weight_decay=weight_decay)
    _train(ours, a, range(25))
    _train(theirs, b, range(25))
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)
        assert torch.equal(a.state[p]["exp_avg_sq"], b.state[q]["exp_avg_sq"])
        assert a.state[p]["step"].item() == b.state[q]["step"].item()
    assert a.state[ours[3].weight]["step"].item() < 25  # the skipped steps were skipped


def test_state_dicts_move_between_torchs_adam_and_ours():
    ours, theirs = _models()
    b = torch.optim.Adam(theirs.parameters(), lr=0.02, weight_decay=1e-4)
    _train(theirs, b, range(7))
    ours.load_state_dict(theirs.state_dict())
    a = Adam(ours.parameters())
    a.load_state_dict(b.state_dict())  # resumed from torch's
    assert a.param_groups[0]["lr"] == 0.02
    _train(ours, a, range(7, 15))
    _train(theirs, b, range(7, 15))
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)
    c = torch.optim.Adam(_models()[1].parameters())
    c.load_state_dict(a.state_dict())  # and back
    assert c.state_dict()["param_groups"][0]["weight_decay"] == 1e-4


def test_step_post_hooks_run_after_each_step_as_torchs_until_removed():
    ours, theirs = _models()
    a, b = Adam(ours.parameters(), lr=0.01), torch.optim.Adam(theirs.parameters(), lr=0.01)
    seen: dict[str, list] = {"ours": [], "torch": []}
    handles = [opt.register_step_post_hook(lambda o, args, kwargs, k=key: seen[k].append((o, args, kwargs)))
               for opt, key in ((a, "ours"), (b, "torch"))]
    _train(ours, a, range(3))
    _train(theirs, b, range(3))
    assert seen["ours"] == [(a, (a,), {})] * 3 and seen["torch"] == [(b, (b,), {})] * 3
    for handle in handles:
        handle.remove()
    _train(ours, a, range(3, 5))
    assert len(seen["ours"]) == 3


def test_a_state_for_another_model_is_refused_in_one_line():
    ours, _ = _models()
    a = Adam(ours.parameters())
    _train(ours, a, range(2))
    other = Adam(nn.Linear(7, 5).parameters())
    with pytest.raises(ValueError, match="for 6 parameters, this model has 2"):
        other.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="no parameters"):
        Adam([])
    with pytest.raises(ValueError, match="betas"):
        Adam(ours.parameters(), betas=(0.9, 1.0))


def test_one_process_training_never_loads_torchs_compiler(tmp_path):
    """A node-classification run on one process trains, checkpoints and evaluates without importing
    ``torch._dynamo`` (the ~150 MiB a process that any ``torch.optim.Optimizer`` or DDP costs); the 3-rank
    runs of ``tests/test_dist_training.py`` check the same for ranks."""
    script = textwrap.dedent(f"""
        import sys
        from gnnscale.train.cli import main
        code = main(["--num-nodes", "2000", "--epochs", "2", "--hidden", "8", "--out", {str(tmp_path / "run")!r}])
        assert code in (0, None), code
        print("compiler loaded:", "torch._dynamo" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiler loaded: False" in done.stdout, done.stdout[-2000:]
