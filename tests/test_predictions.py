"""Predictions out: layer-wise inference of the same weights gives the same rows on 1 and on 2 ranks, saved in
original ids; the command's --save-predictions writes every node's row from every rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from distributed_helpers import partition_dataset, run_ranks


def synthetic() -> Any:
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

    return generate_synthetic(SyntheticConfig(num_nodes=900, avg_degree=6, num_classes=3, feat_dim=8, seed=4))


def infer_and_save(rank: int, source: str, out: str, model: str, halo_rows: list[int] | None = None) -> list[int]:
    """Layer-wise inference saved to ``out``; ``halo_rows[rank]``: the halo rows a wave may hold at layer 0 (None:
    the default).  Returns the number of waves each layer planned (none: one wave of every halo row)."""
    import torch

    import gnnscale as gs
    import gnnscale.inference as inference

    waves: list[int] = []
    plan_waves = inference._plan_waves

    def counted(*args: Any) -> Any:
        plan = plan_waves(*args)
        waves.append(len(plan))
        return plan
    inference._plan_waves = counted
    with gs.init() as world:
        graph = gs.open_graph(source, world) if Path(source).is_dir() else gs.Graph.from_dataset(synthetic(), world)
        if halo_rows is not None:
            inference.HALO_BYTES = halo_rows[rank] * graph.feature_dim * 4
        torch.manual_seed(0)  # the same weights everywhere
        module = gs.GNN(gs.ModelConfig(model=model, num_layers=2, hidden=8, heads=2), graph.feature_dim,
                        graph.num_classes)
        gs.layerwise_inference(graph, module, self_loops=model != "sage", gcn_norm=model == "gcn",
                               batch_size=100).save(out)
    return waves


@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_two_ranks_write_the_rows_one_process_writes(tmp_path: Path, model: str) -> None:
    import gnnscale as gs

    parts = partition_dataset(synthetic(), tmp_path / "parts", 2)
    infer_and_save(0, "in-memory", str(tmp_path / "one"), model)
    run_ranks(infer_and_save, 2, str(parts), str(tmp_path / "two"), model, timeout=240.0)
    one, two = gs.read_outputs(tmp_path / "one"), gs.read_outputs(tmp_path / "two")
    assert one.shape == two.shape == (900, 3)
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-5)
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert manifest["num_parts"] == 2 and manifest["num_nodes"] == 900


@pytest.mark.parametrize("halo_rows", [[8, 8], [8, 10**6]])
def test_halo_rows_gathered_in_waves_give_the_same_rows(tmp_path: Path, halo_rows: list[int]) -> None:
    """Evaluation's halo rows a wave of blocks at a time (a tiny :data:`gnnscale.inference.HALO_BYTES`): the same
    rows as one process, also where one rank has a single wave and its peer several (it gathers nothing for them)."""
    import gnnscale as gs

    parts = partition_dataset(synthetic(), tmp_path / "parts", 2)
    infer_and_save(0, "in-memory", str(tmp_path / "one"), "sage")
    waves = run_ranks(infer_and_save, 2, str(parts), str(tmp_path / "two"), "sage", halo_rows, timeout=240.0)
    assert waves[0] and waves[0][0] > 1  # rank 0 ran layer 0 in several waves
    if halo_rows[1] > 8:
        assert waves[1] == []  # its peer in one
    np.testing.assert_allclose(gs.read_outputs(tmp_path / "two"), gs.read_outputs(tmp_path / "one"), rtol=1e-5,
                               atol=1e-5)


def infer_and_score(rank: int, source: str) -> dict[str, float]:
    """Accuracy and ROC-AUC (of class 0 against the rest) of the same weights' rows on the graph's val and test
    ids, and how many row gathers each needed."""
    import torch

    import gnnscale as gs

    with gs.init() as world:
        graph = gs.open_graph(source, world) if Path(source).is_dir() else gs.Graph.from_dataset(synthetic(), world)
        torch.manual_seed(0)
        module = gs.GNN(gs.ModelConfig(model="sage", num_layers=2, hidden=8), graph.feature_dim, graph.num_classes)
        outputs = gs.layerwise_inference(graph, module, batch_size=100)
        gathers, gather = [0], world.exchanger.all_gather_rows
        world.exchanger.all_gather_rows = lambda rows: (gathers.__setitem__(0, gathers[0] + 1), gather(rows))[1]
        scores = {"val": outputs.score(graph.val_ids), "test": outputs.score(graph.test_ids),
                  "accuracy_gathers": gathers[0]}
        scores["auc"] = outputs.score(graph.test_ids, (graph.labels == 0).long(), metric="roc_auc")
        scores["auc_gathers"] = gathers[0] - scores["accuracy_gathers"]
    return scores


def test_accuracy_is_summed_across_ranks_not_gathered(tmp_path: Path) -> None:
    """Accuracy on 2 ranks is one all-reduce of counts (no rank holds another's rows: on a 3M-node graph the
    gathered logits were 140 MiB a rank) and equals one process's; a ranking metric still gathers the scores."""
    parts = partition_dataset(synthetic(), tmp_path / "parts", 2)
    one = infer_and_score(0, "in-memory")
    two = run_ranks(infer_and_score, 2, str(parts), timeout=240.0)
    for scores in two:
        assert scores["accuracy_gathers"] == 0 and scores["auc_gathers"] == 2
        for key in ("val", "test", "auc"):
            assert scores[key] == pytest.approx(one[key], abs=1e-6), key
    assert 0.0 < one["test"] < 1.0


def train_with_predictions(rank: int, parts: str, out: str) -> int:
    from gnnscale.train.cli import main

    return main(["--partitions", parts, "--out", out, "--epochs", "1", "--num-layers", "2", "--hidden", "8",
                 "--fanouts", "4,4", "--batch-size", "128", "--save-predictions", "--quiet"])


def test_command_saves_predictions_of_every_node(tmp_path: Path) -> None:
    import gnnscale as gs

    parts = partition_dataset(synthetic(), tmp_path / "parts", 2)
    assert run_ranks(train_with_predictions, 2, str(parts), str(tmp_path / "run"), timeout=240.0) == [0, 0]
    rows = gs.read_outputs(tmp_path / "run" / "predictions")
    assert rows.shape == (900, 3) and np.isfinite(rows).all()
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["predictions"] == str(tmp_path / "run" / "predictions")


def test_reading_a_folder_that_is_not_outputs_is_one_error(tmp_path: Path) -> None:
    import gnnscale as gs

    with pytest.raises(FileNotFoundError, match="manifest.json does not exist: pass a folder written by"):
        gs.read_outputs(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="is not a gnnscale node-outputs manifest"):
        gs.read_outputs(tmp_path)
