"""Bad distributed command lines stop with one line and exit status 2, before any process group exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnscale.train.cli import main


@pytest.mark.parametrize("extra,message", [
    (["--failure-timeout", "0"], "--failure-timeout must be > 0, got 0.0 (default 120.0)"),
    (["--cache-mb", "-1"], "--cache-mb must be >= 0, got -1.0 (default auto)"),
    (["--prefetch", "-2"], "--prefetch must be >= 0, got -2 (default 2)"),
])
def test_bad_distributed_options_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     extra: list[str], message: str) -> None:
    parts = tmp_path / "parts"
    assert main(["--partitions", str(_one_part(parts)), "--out", str(tmp_path / "run"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"error: {message}"
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_cache_mb_is_auto_or_a_number(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from gnnscale.distributed import feature_store
    from gnnscale.train.cli import build_parser

    assert build_parser().parse_args([]).cache_mb == "auto"
    assert build_parser().parse_args(["--cache-mb", "256"]).cache_mb == 256.0
    with pytest.raises(SystemExit) as exit_info:
        main(["--cache-mb", "lots"])
    assert exit_info.value.code == 2
    assert "--cache-mb 'lots' is neither auto nor a number of MiB, e.g. 256" in capsys.readouterr().err
    # auto: a quarter of the available memory (within the process's memory cgroup), shared among the machine's ranks.
    monkeypatch.setattr(feature_store, "available_bytes", lambda: 8 * 2**30)
    assert feature_store.auto_cache_mb(1) == 2048.0 and feature_store.auto_cache_mb(4) == 512.0

def test_missing_partition_folder_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--partitions", str(tmp_path / "absent"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "absent" in err[0]


def _one_part(out: Path) -> Path:
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
    from partition import PartitionConfig, partition_graph

    partition_graph(generate_synthetic(SyntheticConfig(num_nodes=2000, avg_degree=5, feat_dim=4)), out,
                    PartitionConfig(num_parts=1))
    return out
