"""``--grad-sync late``: each update applies the previous step's gradient sum, on real gloo ranks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distributed_helpers import partition_dataset, run_ranks

ARGV = ["--model", "sage", "--num-layers", "2", "--hidden", "16", "--fanouts", "10,10", "--dropout", "0",
        "--batch-size", "48", "--epochs", "2", "--lr", "0.02", "--weight-decay", "0", "--num-workers", "1",
        "--checkpoint-every", "0"]


def train_modes(rank: int, part_dir: str) -> list[dict[str, Any]]:
    """Train the same run once per ``--grad-sync``: final weights, the gradient of each update, Adam's count."""
    from gnnscale.distributed.env import init_runtime, read_env
    from gnnscale.train.cli import build_configs, build_parser
    from gnnscale.train.trainer import Trainer
    from partition.load import load_partition

    part = load_partition(part_dir, rank)
    runtime = init_runtime(read_env(), timeout=120.0)
    out = []
    try:
        for mode in ("step", "late"):
            model, sampler, train, cache = build_configs(build_parser().parse_args(ARGV + ["--grad-sync", mode]))
            trainer = Trainer.on_partition(part, runtime, split=0, model_config=model, sampler_config=sampler, config=train,
                              cache_config=cache)
            applied: list[dict[str, torch.Tensor]] = []
            step = trainer.optimizer.step

            def recorded_step(step: Any = step, trainer: Trainer = trainer) -> None:
                applied.append({n: p.grad.clone() for n, p in trainer.module.named_parameters()})
                step()
            trainer.optimizer.step = recorded_step
            result = trainer.fit()
            adam_steps = {int(s["step"]) for s in trainer.optimizer.state.values()}
            out.append({"weights": {k: v.clone() for k, v in trainer.module.state_dict().items()},
                        "applied": applied, "adam_steps": adam_steps, "steps": trainer.steps,
                        "late": trainer.late, "val": result.val,
                        "grad_wait": [h["grad_wait_s"] for h in result.history]})
    finally:
        runtime.close()
    return out


@pytest.fixture(scope="module")
def mode_runs(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

    dataset = generate_synthetic(SyntheticConfig(num_nodes=2000, avg_degree=6, num_classes=4, feat_dim=8, seed=2))
    part_dir = partition_dataset(dataset, tmp_path_factory.mktemp("parts") / "syn", 2)
    return run_ranks(train_modes, 2, str(part_dir), timeout=300.0)


def test_late_applies_every_sum_once_and_keeps_replicas_equal(mode_runs: list[list[dict[str, Any]]]) -> None:
    step, late = mode_runs[0]
    assert not step["late"] and late["late"]
    # Every step's sum is applied once: the last one before the epoch ends, none carried into the next.
    assert len(late["applied"]) == len(step["applied"]) == 2 * step["steps"]
    assert late["adam_steps"] == step["adam_steps"] == {2 * step["steps"]}
    for mode in (0, 1):  # every rank applied the same sums, in either mode
        for name, weight in mode_runs[0][mode]["weights"].items():
            torch.testing.assert_close(mode_runs[1][mode]["weights"][name], weight, rtol=0, atol=0)
    assert len(late["grad_wait"]) == 2 and all(w >= 0 for w in late["grad_wait"])


def test_late_first_update_is_the_single_machine_one_then_a_step_stale(
        mode_runs: list[list[dict[str, Any]]]) -> None:
    step, late = mode_runs[0]
    # Update 0: both apply the gradient of step 0's global mean loss at the initial weights (the step mode's sum
    # started during the backward against the late mode's after it).
    for name, grad in step["applied"][0].items():
        torch.testing.assert_close(late["applied"][0][name], grad, rtol=1e-4, atol=1e-6)
    # Update 1: the late mode's gradient of step 1 was taken before update 0: not the step mode's.
    assert any(not torch.allclose(late["applied"][1][n], g, rtol=1e-3, atol=1e-5)
               for n, g in step["applied"][1].items())
    # One step stale still trains (4 classes: chance is 0.25); its accuracy on a real graph is measured by
    # scripts/bench_cluster.py.
    assert late["val"] > 0.5 and step["val"] > 0.5, (late["val"], step["val"])


def test_bad_grad_sync_is_refused() -> None:
    from gnnscale.train.cli import build_parser
    from gnnscale.train.trainer import TrainConfig

    with pytest.raises(ValueError, match="grad_sync must be one of step, late, got 'never'"):
        TrainConfig(grad_sync="never")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--grad-sync", "never"])


def test_default_loader_thread_follows_the_gradient_sync() -> None:
    """One core per rank: a loader thread only where a step would otherwise wait out its gradient sum."""
    from gnnscale.train.cli import default_num_workers

    assert default_num_workers(1, 1, "step") == 0 and default_num_workers(1, 1, "late") == 0
    assert default_num_workers(1, 2, "step") == 1 and default_num_workers(1, 2, "late") == 0
    assert default_num_workers(2, 2, "late") == 1 and default_num_workers(4, 1, "step") == 1


def train_own_model(rank: int, part_dir: str) -> dict[str, Any]:
    """A model given to the trainer, built differently on each rank, with a buffer each rank moves its own way."""
    import gnnscale as gs
    from gnnscale.train.trainer import TrainConfig
    from samplers import SamplerConfig

    with gs.init() as world:
        graph = gs.open_graph(part_dir, world)
        torch.manual_seed(rank)  # unlike the built-in model's, these initial weights differ between ranks
        model = gs.GNN(gs.ModelConfig(num_layers=2, hidden=8), graph.feature_dim, graph.num_classes)
        model.register_buffer("moved", torch.zeros(3))

        def move(module: Any, inputs: Any) -> None:
            module.moved.add_(rank + 1.0)
        model.register_forward_pre_hook(move)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        trainer = gs.Trainer(graph, model=model, sampler_config=SamplerConfig(fanouts=[5, 5]),
                             config=TrainConfig(epochs=1, batch_size=64, lr=0.01, num_workers=0))
        started = {k: v.clone() for k, v in model.state_dict().items()}
        trainer.fit()
        return {"initial": initial, "started": started, "final": {k: v.clone() for k, v in model.state_dict().items()},
                "steps": trainer.steps}


def test_a_given_model_starts_from_rank_0s_weights_and_keeps_its_buffers(tmp_path) -> None:
    """What DDP did for a model given to the trainer: rank 0's parameters and buffers everywhere at the start,
    and rank 0's buffers after every update, so the replicas stay equal."""
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

    dataset = generate_synthetic(SyntheticConfig(num_nodes=1200, avg_degree=6, num_classes=3, feat_dim=8, seed=4))
    part_dir = partition_dataset(dataset, tmp_path / "syn", 2)
    zero, one = run_ranks(train_own_model, 2, str(part_dir), timeout=300.0)
    name = next(k for k in zero["initial"] if k != "moved")
    assert not torch.equal(zero["initial"][name], one["initial"][name])
    for key in zero["started"]:
        assert torch.equal(one["started"][key], zero["initial"][key]), key
        assert torch.equal(one["final"][key], zero["final"][key]), key
    # rank 0's buffer moved by 1 a forward; rank 1's would have moved by 2 and be ahead without the sync
    assert zero["final"]["moved"][0] >= zero["steps"] > 0
