"""Trainer and command line: layer-wise inference, metrics.json, accuracy on real data, error exits."""

import json

import numpy as np
import pytest
import torch

from gnnscale.data.dataset import GraphDataset, csc_from_edges
from gnnscale.nn import ModelConfig
from gnnscale.train.cli import main
from gnnscale.distributed.env import DistEnv, init_runtime
from gnnscale.train.trainer import Trainer, TrainConfig
from partition.load import whole_graph_partition
from samplers import SamplerConfig
from conftest import read_strict_json


def planted_dataset(num_nodes=600, num_classes=3, seed=0) -> GraphDataset:
    """Small homophilous graph: same-class edges 9x likelier, features = class centroid + noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, num_nodes)
    src = rng.integers(0, num_nodes, 8 * num_nodes)
    dst = rng.integers(0, num_nodes, 8 * num_nodes)
    keep = (labels[src] == labels[dst]) | (rng.random(src.size) < 0.1)
    indptr, indices = csc_from_edges(src[keep], dst[keep], num_nodes, symmetrize=True)
    features = rng.normal(size=(num_classes, 16))[labels] + 2.0 * rng.normal(size=(num_nodes, 16))
    order = rng.permutation(num_nodes)
    masks = [np.isin(np.arange(num_nodes), order[a:b]) for a, b in ((0, 200), (200, 400), (400, num_nodes))]
    return GraphDataset(name="planted", indptr=indptr, indices=indices, features=features, labels=labels,
                        train_masks=masks[0], val_masks=masks[1], test_masks=masks[2], num_classes=num_classes)


def local_trainer(dataset: GraphDataset, **kwargs) -> Trainer:
    """The trainer of a plain ``python`` run: a world of one over the whole graph."""
    return Trainer.on_partition(whole_graph_partition(dataset), init_runtime(DistEnv()), **kwargs)


@pytest.mark.parametrize("model,residual", [("sage", False), ("gcn", False), ("gat", False), ("sage", True)])
def test_layerwise_inference_equals_full_fanout_forward(model, residual):
    data = planted_dataset()
    model_config = ModelConfig(model=model, num_layers=2, hidden=8, heads=2, residual=residual)
    sampler_config = SamplerConfig(fanouts=[-1, -1], gcn_norm=model == "gcn", self_loops=model != "sage")
    trainer = local_trainer(data, split=0, model_config=model_config, sampler_config=sampler_config,
                                        config=TrainConfig(eval_batch_size=128))
    everything = trainer.inference()
    seeds = torch.tensor([0, 5, 77, 599])
    batch = trainer.sampler.sample(seeds, rng=np.random.default_rng(0))
    trainer.model.eval()  # inference restores the module's mode: the direct forward must not drop out
    with torch.no_grad():
        direct = trainer.model(batch.blocks, trainer.features.rows[batch.input_ids])
    torch.testing.assert_close(everything[seeds], direct, atol=1e-5, rtol=1e-5)



@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("num_seeds", [0, 3])
def test_every_parameter_gets_a_gradient_when_no_seed_has_an_edge(model, num_seeds):
    """A rank whose step has no edges (no seeds, or isolated ones) still gives every weight a gradient:
    DDP without unused-parameter detection fails the next step otherwise (seen with uneven seed shares)."""
    from gnnscale.batch import Block
    from gnnscale.nn import GNN

    net = GNN(ModelConfig(model=model, num_layers=2, hidden=16, heads=2), in_dim=8, out_dim=4)
    ids = torch.arange(num_seeds)
    blocks = [Block(indptr=torch.zeros(num_seeds + 1, dtype=torch.int64), indices=torch.empty(0, dtype=torch.int64),
                    src_ids=ids, num_dst=num_seeds) for _ in range(2)]
    net(blocks, torch.randn(num_seeds, 8)).sum().backward()
    missing = [name for name, p in net.named_parameters() if p.grad is None]
    assert not missing, missing


def test_training_learns_planted_classes_and_restores_best_epoch():
    data = planted_dataset()
    trainer = local_trainer(
        data, split=0, model_config=ModelConfig(model="sage", num_layers=2, hidden=16),
        sampler_config=SamplerConfig(fanouts=[5, 5]), config=TrainConfig(epochs=15, batch_size=64, seed=1))
    result = trainer.fit()
    assert result.test > 0.8  # features alone give ~0.6 at this noise level
    val, test = trainer.evaluate()
    assert val == pytest.approx(result.val) and test == pytest.approx(result.test)  # best state restored
    assert result.epochs_run == 15 and len(result.history) == 15


def test_early_stopping_stops():
    data = planted_dataset()
    trainer = local_trainer(
        data, split=0, model_config=ModelConfig(model="sage", num_layers=1, hidden=4),
        sampler_config=SamplerConfig(fanouts=[5]), config=TrainConfig(epochs=200, patience=2, lr=1e-9))
    assert trainer.fit().epochs_run < 200


def test_fanouts_must_match_layers():
    with pytest.raises(ValueError, match="got 1 fanouts for 2 layers"):
        local_trainer(planted_dataset(), split=0, model_config=ModelConfig(num_layers=2),
                                  sampler_config=SamplerConfig(fanouts=[5]), config=TrainConfig())


@pytest.mark.parametrize("kwargs,match", [({"epochs": 0}, "epochs must be >= 1"), ({"lr": 0.0}, "lr must be > 0"),
                                          ({"num_workers": -1}, "num_workers must be >= 0"),
                                          ({"prefetch": -1}, "prefetch must be >= 0, got -1")])
def test_train_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_model_config_errors():
    with pytest.raises(ValueError, match="unknown model 'gin'"):
        ModelConfig(model="gin")
    with pytest.raises(ValueError, match="dropout must be in"):
        ModelConfig(dropout=1.5)


def test_cli_cora_gcn_reaches_published_accuracy(dataset_dir, tmp_path):
    cora = dataset_dir("cora")
    code = main(["--dataset", "cora", "--data-dir", str(cora), "--model", "gcn", "--num-layers", "2",
                 "--hidden", "16", "--fanouts", "-1,-1", "--batch-size", "140", "--epochs", "200",
                 "--quiet", "--out", str(tmp_path)])
    assert code == 0
    metrics = read_strict_json(tmp_path / "metrics.json")
    for key in ("dataset", "model", "metric", "val", "test", "epochs_run", "train_seconds", "world_size", "args"):
        assert key in metrics
    assert metrics["dataset"] == "cora" and metrics["metric"] == "accuracy" and metrics["world_size"] == 1
    assert metrics["test"] >= 0.79  # one seed; the 5-seed mean is in the README table


def test_cli_errors_are_one_line_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--dataset", "cora", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--data-dir" in err and "\n" not in err
    assert main(["--dataset", "cora", "--data-dir", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "nope" in capsys.readouterr().err
    assert not out.exists()


def test_split_out_of_range_and_block_count_errors():
    data = planted_dataset()
    with pytest.raises(ValueError, match="split 1 does not exist: planted has 1 split"):
        data.split(1)
    from gnnscale.nn import GNN

    model = GNN(ModelConfig(num_layers=2, hidden=4), 16, 3)
    with pytest.raises(ValueError, match="got 1 blocks for a 2-layer model"):
        model([None], torch.zeros(1, 16))


def test_cli_rejects_malformed_fanouts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--fanouts", "15,x"])
    assert exit_info.value.code == 2
    assert "is not a comma-separated list of integers" in capsys.readouterr().err


def test_ctrl_c_stops_training_promptly_and_writes_nothing(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "train_node_classification.py"
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), "--dataset", "synthetic", "--num-nodes", "20000",
                             "--epochs", "100", "--num-workers", "2", "--out", str(out)],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # wait until training (and so the loader's workers) has started
            if "epoch   1" in line or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 15, stderr[-3000:]
    assert proc.returncode == 130, stderr
    assert "interrupted: no metrics.json written" in stderr
    assert not (out / "metrics.json").exists()


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_training_is_the_same_with_any_number_of_loader_workers(num_workers):
    data = planted_dataset()

    def run(workers):
        trainer = local_trainer(
            data, split=0, model_config=ModelConfig(model="sage", num_layers=2, hidden=16),
            sampler_config=SamplerConfig(fanouts=[5, 5]),
            config=TrainConfig(epochs=3, batch_size=64, seed=4, num_workers=workers))
        result = trainer.fit()
        return [round(h["loss"], 6) for h in result.history], result.test, result.history

    losses, test, history = run(num_workers)
    reference_losses, reference_test, _ = run(2)
    assert losses == reference_losses and test == reference_test
    for record in history:  # the per-epoch time split is recorded
        assert record["compute_s"] > 0 and record["sample_s"] > 0 and record["wait_s"] >= 0


def test_features_on_device_is_ignored_with_a_warning_on_cpu(caplog):
    trainer = local_trainer(
        planted_dataset(), split=0, model_config=ModelConfig(model="sage", num_layers=1, hidden=4),
        sampler_config=SamplerConfig(fanouts=[5]), config=TrainConfig(epochs=1, features_on_device=True))
    assert trainer.loader.feeder.device_features is None
    assert "features_on_device has no effect here" in caplog.text
