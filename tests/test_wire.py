"""The wire codec (``gnnscale.distributed.wire``): bounds, payload sizes, refusals, and a DistTable on 2 gloo ranks."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch

from distributed_helpers import run_ranks
from gnnscale.distributed import wire

LOSSY = ("float16", "bfloat16", "int8")
# Rows of the 2-rank job: rank 0 owns [0, 37), rank 1 owns [37, 80).
OFFSETS = (0, 37, 80)
NUM_FEATURES = 6
NUM_IDS = 120


def hard_rows(num_rows: int = 64, d: int = 9, seed: int = 0) -> torch.Tensor:
    """float32 [num_rows, d] rows of every kind of magnitude: normal, zero rows, huge, tiny, subnormal, mixed."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(num_rows, d, generator=gen) * torch.logspace(-3, 3, num_rows).unsqueeze(1)
    rows[0] = 0.0
    rows[1] *= 1e30
    rows[2] *= 1e-30
    rows[3] *= 1e-41  # float32 subnormals
    rows[4] = rows[4].sign() * 3.3e38  # near float32's largest value, above bfloat16's
    rows[5, :3] = torch.tensor([1e5, -7e4, 65519.0])[:d]  # beyond float16's range
    rows[6] = torch.tensor([1.0, 1e-30, 1e-40, 0.0, 3.0, -2.0, 1e-20, -1e-7, 5e-5])[:d]  # mixed within a row
    rows[7] = torch.tensor([1e-43, 0, 0, 0, 0, 0, -1e-44, 0, 0])[:d]  # scale underflows to 0
    rows[8] = -0.0
    return rows


def rows_error(decoded: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return (decoded.double() - rows.double()).abs()


# ---------------------------------------------------------------------- the codec
@pytest.mark.parametrize("dtype", wire.WIRE_DTYPES)
@pytest.mark.parametrize("d", [1, 3, 9])
def test_round_trip_is_within_the_stated_bound(dtype: str, d: int) -> None:
    rows = hard_rows(d=d, seed=d)
    decoded = wire.decode(wire.encode(rows, dtype), dtype, d)
    assert decoded.dtype == torch.float32 and decoded.shape == rows.shape
    assert torch.isfinite(decoded).all()
    error, bound = rows_error(decoded, rows), wire.error_bound(dtype, rows)
    assert (error <= bound).all(), f"{dtype}: worst error/bound {float((error / bound.clamp(min=1e-300)).max())}"


def test_the_bounds_are_the_documented_ones() -> None:
    rows = torch.tensor([[1.0, -3.0, 100.0, 1e-20], [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(wire.error_bound("float16", rows)[0, :3], torch.tensor([1.0, 3.0, 100.0]).double() * 2**-11)
    assert torch.equal(wire.error_bound("bfloat16", rows)[0, :3], torch.tensor([1.0, 3.0, 100.0]).double() * 2**-8)
    int8 = wire.error_bound("int8", rows)
    assert torch.allclose(int8[0], torch.full((4,), 100.0 / 254, dtype=torch.float64), rtol=1e-4)
    assert (int8[1] < 1e-40).all()  # a zero row is exact (the bound is only the rounding floor)
    assert (wire.error_bound("float32", rows) == 0).all()


def test_float32_is_the_rows_themselves() -> None:
    rows = hard_rows()
    payload = wire.encode(rows, "float32")
    assert payload is rows
    assert torch.equal(wire.decode(payload, "float32", rows.shape[1]), rows)


def test_zero_rows_decode_to_exact_zeros_and_int8_keeps_the_row_maximum() -> None:
    rows = torch.tensor([[0.0, 0.0, 0.0], [-4.0, 1.0, 2.5], [1e-44, 0.0, -3e-45]])
    decoded = wire.decode(wire.encode(rows, "int8"), "int8", 3)
    assert torch.equal(decoded[0], torch.zeros(3))
    assert float(decoded[1, 0]) == pytest.approx(-4.0, rel=1e-6)
    assert torch.equal(decoded[2], torch.zeros(3))  # its scale underflows: zeros, within 2^-140
    for dtype in ("float16", "bfloat16"):
        assert torch.equal(wire.decode(wire.encode(rows[:1], dtype), dtype, 3), torch.zeros(1, 3))


def test_float16_clamps_instead_of_overflowing_to_inf() -> None:
    rows = torch.tensor([[1e6, -1e38, 65519.0, 65504.0]])
    decoded = wire.decode(wire.encode(rows, "float16"), "float16", 4)
    assert decoded.tolist() == [[65504.0, -65504.0, 65504.0, 65504.0]]
    big = torch.tensor([[3.4e38, -3.4e38]])
    assert torch.isfinite(wire.decode(wire.encode(big, "bfloat16"), "bfloat16", 2)).all()


@pytest.mark.parametrize("d", [1, 5, 100])
def test_payload_bytes_per_row_are_as_documented(d: int) -> None:
    rows = torch.randn(7, d)
    expected = {"float32": 4 * d, "float16": 2 * d, "bfloat16": 2 * d, "int8": d + 4}
    for dtype, per_row in expected.items():
        payload = wire.encode(rows, dtype)
        assert payload.shape[0] == 7
        assert payload.element_size() * payload.shape[1] == per_row == wire.row_bytes(dtype, d)
        buffer = wire.empty_payload(7, dtype, d)
        assert buffer.dtype == payload.dtype and buffer.shape == payload.shape
    assert wire.encode(rows, "int8").dtype == torch.uint8


def test_decode_writes_into_out() -> None:
    rows = hard_rows(d=5)
    for dtype in wire.WIRE_DTYPES:
        out = torch.full((rows.shape[0], 5), float("nan"))
        assert wire.decode(wire.encode(rows, dtype), dtype, 5, out=out) is out
        assert (rows_error(out, rows) <= wire.error_bound(dtype, rows)).all()


@pytest.mark.parametrize("d", [1, 5, 1433])
def test_a_single_row_whose_scale_is_unaligned_round_trips(d: int) -> None:
    # One row's slice of the payload is contiguous at offset d: the scale must still be read (cora, d = 1433,
    # failed so before the fix whenever an owner answered a single row).
    rows = torch.linspace(-1, 1, d).unsqueeze(0)
    for k in (1, 3):
        many = rows.repeat(k, 1)
        back = wire.decode(wire.encode(many, "int8"), "int8", d)
        assert (rows_error(back, many) <= wire.error_bound("int8", many)).all()


def test_empty_payloads_round_trip() -> None:
    for dtype in wire.WIRE_DTYPES:
        assert wire.decode(wire.encode(torch.empty(0, 4), dtype), dtype, 4).shape == (0, 4)


@pytest.mark.parametrize("dtype", LOSSY)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_refused_naming_the_row(dtype: str, value: float) -> None:
    rows = torch.ones(4, 3)
    rows[2, 1] = value
    with pytest.raises(ValueError, match=rf"wire dtype {dtype} cannot send non-finite values: row 2 of the 4 being "
                                         rf"sent holds {value}.*--wire-dtype float32"):
        wire.encode(rows, dtype)


def test_float32_sends_non_finite_values_as_they_are() -> None:
    rows = torch.tensor([[float("nan"), float("inf"), 1.0]])
    assert wire.encode(rows, "float32") is rows


def test_bad_dtypes_and_rows_are_refused() -> None:
    with pytest.raises(ValueError, match=r"--wire-dtype must be one of float32, float16, bfloat16, int8, got 'fp8'"):
        wire.encode(torch.ones(2, 2), "fp8")
    with pytest.raises(TypeError, match=r"takes float32 \[k, d\] rows, got torch.float64 of shape \[2, 2\]"):
        wire.encode(torch.ones(2, 2, dtype=torch.float64), "int8")
    with pytest.raises(TypeError, match=r"got torch.float32 of shape \[4\]"):
        wire.encode(torch.ones(4), "float16")


def test_dist_table_refuses_a_lossy_wire_for_non_float_rows() -> None:
    from gnnscale.distributed.comm import Exchanger
    from gnnscale.distributed.feature_store import DistTable

    ids = torch.arange(5, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"wire dtype int8 encodes float32 tables only, and this one holds torch.int64"):
        DistTable(ids, torch.tensor([0, 5]), Exchanger(None, 0, 1), wire_dtype="int8")
    with pytest.raises(ValueError, match=r"--wire-dtype must be one of .*, got 'half'"):
        DistTable(ids.float(), torch.tensor([0, 5]), Exchanger(None, 0, 1), wire_dtype="half")
    assert DistTable(ids, torch.tensor([0, 5]), Exchanger(None, 0, 1)).wire_dtype == "float32"


@pytest.mark.parametrize("dtype", wire.WIRE_DTYPES)
@pytest.mark.parametrize("k", [0, 1, 5])  # 0 and 1 rows: slices that are contiguous at odd offsets
def test_bytes_of_rows_round_trip_from_a_wider_buffer(dtype: str, k: int) -> None:
    """to_bytes/from_bytes: the rows come back within the bound from a column slice of a wider uint8
    buffer (exact float64 bytes beside them), every row byte_width bytes."""
    rows = torch.randn(k, 7, generator=torch.Generator().manual_seed(3)) * 50
    times = torch.arange(float(k), dtype=torch.float64)
    packed = torch.cat([wire.to_bytes(rows, dtype), times.reshape(-1, 1).view(torch.uint8)], 1)
    width = wire.byte_width(dtype, 7)
    assert packed.dtype == torch.uint8 and packed.shape == (k, width + 8) and width == wire.row_bytes(dtype, 7)
    back = wire.from_bytes(packed[:, :width], dtype, 7)
    assert back.dtype == torch.float32 and back.shape == (k, 7)
    assert bool((rows_error(back, rows) <= wire.error_bound(dtype, rows)).all())
    assert torch.equal(wire.bytes_as(packed[:, width:], torch.float64).reshape(-1), times)


def test_float32_bytes_carry_any_float_dtype_exactly() -> None:
    rows = torch.randn(4, 3, dtype=torch.float64) / 3
    assert wire.byte_width("float32", 3, torch.float64) == 24
    assert torch.equal(wire.from_bytes(wire.to_bytes(rows, "float32"), "float32", 3, torch.float64), rows)
    with pytest.raises(TypeError, match=r"wire encoding takes float32 \[k, d\] rows, got torch.float64"):
        wire.to_bytes(rows, "int8")


# ---------------------------------------------------------------------- configuration and command line
def test_cache_config_and_command_line_carry_the_wire_dtype() -> None:
    from gnnscale import options
    from gnnscale.train import cli
    from gnnscale.train.trainer import CacheConfig

    assert options.WIRE_DTYPES == wire.WIRE_DTYPES
    assert CacheConfig().wire_dtype == "float32"
    with pytest.raises(ValueError, match=r"--wire-dtype must be one of float32, float16, bfloat16, int8, got 'int4'"):
        CacheConfig(wire_dtype="int4")
    parser = cli.build_parser()
    assert parser.parse_args([]).wire_dtype == "float32"
    *_, cache_config = cli.build_configs(parser.parse_args(["--wire-dtype", "int8"]))
    assert cache_config.wire_dtype == "int8"


def test_wire_dtype_in_a_world_of_one_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from gnnscale.options import warn_no_effect
    from gnnscale.train import cli

    parser = cli.build_parser()
    args = parser.parse_args(["--wire-dtype", "float16"])
    with caplog.at_level(logging.WARNING, logger="gnnscale"):
        assert warn_no_effect(parser, args, cli.NO_EFFECT, world_size=1) == ["--wire-dtype"]
        assert warn_no_effect(parser, args, cli.NO_EFFECT, world_size=2) == []
    assert caplog.messages == ["--wire-dtype has no effect: a world of one sends no rows over a wire"]


def test_checkpoints_without_a_wire_dtype_resume_as_float32(tmp_path) -> None:
    from gnnscale.train.checkpoint import load_checkpoint, save_checkpoint

    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"fingerprint": {"lr": 0.01}})  # written before the wire dtype was recorded
    assert load_checkpoint(path, {"lr": 0.01, "wire_dtype": "float32"})
    with pytest.raises(ValueError, match=r"different run \(wire_dtype = 'float32', this run has 'int8'\)"):
        load_checkpoint(path, {"lr": 0.01, "wire_dtype": "int8"})


# ---------------------------------------------------------------------- a DistTable on 2 gloo ranks
def every_row() -> torch.Tensor:
    """The whole [80, NUM_FEATURES] table, the same on every rank (each owns a slice of it)."""
    return hard_rows(OFFSETS[-1], NUM_FEATURES, seed=11)


def table_checks(rank: int) -> dict[str, Any]:
    """Per wire dtype: what ``gather``, ``gather_grouped`` and a cache fill return, with the bytes sent."""
    from gnnscale.distributed import comm
    from gnnscale.distributed.comm import Exchanger
    from gnnscale.distributed.env import init_runtime, read_env
    from gnnscale.distributed.feature_store import DistTable

    runtime = init_runtime(read_env(), timeout=60.0)
    try:
        exchanger = Exchanger(runtime.sample_group, rank, runtime.world_size)
        offsets = torch.tensor(OFFSETS)
        start, end = OFFSETS[rank], OFFSETS[rank + 1]
        full = every_row()
        ids = torch.from_numpy(np.random.default_rng(rank).integers(0, OFFSETS[-1], NUM_IDS))  # repeats included
        unique = torch.unique(ids)
        out: dict[str, Any] = {}
        for dtype in wire.WIRE_DTYPES:
            table = DistTable(full[start:end].clone(), offsets, exchanger, wire_dtype=dtype)
            exchanger.stats.reset()
            gathered = table.gather(ids)
            gather_stats = (exchanger.stats.bytes_sent, table.stats.remote_rows)
            exchanger.stats.reset()
            table.stats.reset()
            grouped = torch.full((unique.numel(), NUM_FEATURES), float("nan"))
            order = table.gather_grouped(unique, out=grouped)
            grouped_stats = (exchanger.stats.bytes_sent, table.stats.remote_rows)
            halo = unique[(unique < start) | (unique >= end)]
            table.fill_cache(halo[::2])
            cached = table.gather(ids)
            # With a cache, in order by the id map (some rows fetched) and grouped by search and sort: the same rows.
            table.use_id_map = True
            by_map = torch.full((unique.numel(), NUM_FEATURES), float("nan"))
            table.stats.reset()
            table.gather_ordered(unique, out=by_map)
            by_map_ids, map_counts = unique, dict(vars(table.stats))
            table.use_id_map = False
            by_sort = torch.full((unique.numel(), NUM_FEATURES), float("nan"))
            table.stats.reset()
            by_sort_ids = unique[table.gather_grouped(unique, out=by_sort)]
            sort_counts = dict(vars(table.stats))
            # A 1-D float table (as degrees are): one value a row.
            column = DistTable(full[start:end, 0].clone(), offsets, exchanger, wire_dtype=dtype).gather(ids)
            out[dtype] = {"gather": gathered, "gather_stats": gather_stats, "grouped": grouped,
                          "grouped_ids": unique[order], "grouped_stats": grouped_stats, "cached": cached,
                          "column": column, "by_map": (by_map_ids, by_map), "by_sort": (by_sort_ids, by_sort),
                          "counts": (map_counts, sort_counts)}
        out["ids"] = ids
        return out
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_ranks(table_checks, 2, timeout=120.0)


@pytest.mark.parametrize("dtype", wire.WIRE_DTYPES)
def test_ordered_gather_by_id_map_and_grouped_by_sort_agree(two_ranks: list[dict[str, Any]], dtype: str) -> None:
    for rank, result in enumerate(two_ranks):
        (map_ids, map_rows), (sort_ids, sort_rows) = result[dtype]["by_map"], result[dtype]["by_sort"]
        map_counts, sort_counts = result[dtype]["counts"]
        assert map_counts == sort_counts and min(map_counts.values()) > 0, (map_counts, sort_counts)  # all 3 kinds
        assert not torch.isnan(map_rows).any() and not torch.isnan(sort_rows).any(), f"rank {rank}: a row unwritten"
        assert torch.equal(torch.sort(map_ids).values, torch.sort(sort_ids).values)
        torch.testing.assert_close(map_rows[torch.argsort(map_ids)], sort_rows[torch.argsort(sort_ids)], rtol=0,
                                   atol=0)


@pytest.mark.parametrize("dtype", wire.WIRE_DTYPES)
def test_remote_rows_over_gloo_are_within_the_bound(two_ranks: list[dict[str, Any]], dtype: str) -> None:
    full = every_row()
    for result in two_ranks:
        ids = result["ids"]
        got = result[dtype]
        for name, rows, wanted in (("gather", got["gather"], full[ids]), ("cached", got["cached"], full[ids]),
                                   ("grouped", got["grouped"], full[got["grouped_ids"]]),
                                   ("column", got["column"].unsqueeze(1), full[ids, :1])):
            assert rows.dtype == torch.float32
            error, bound = rows_error(rows, wanted), wire.error_bound(dtype, wanted)
            assert (error <= bound).all(), (dtype, name)
            if dtype == "float32":
                assert torch.equal(rows, wanted), name
        assert torch.equal(got["cached"], got["gather"])  # the cache holds the rows as they arrived


@pytest.mark.parametrize("dtype", LOSSY)
@pytest.mark.parametrize("call", ["gather", "grouped"])
def test_bytes_sent_shrink_by_the_row_size_ratio(two_ranks: list[dict[str, Any]], dtype: str, call: str) -> None:
    """Each remote row costs its 8-byte id one way and its row the other: bytes = rows x (8 + row bytes)."""
    stats = {name: [result[name][f"{call}_stats"] for result in two_ranks] for name in ("float32", dtype)}
    remote = sum(rows for _, rows in stats[dtype])
    assert remote > 0 and remote == sum(rows for _, rows in stats["float32"])
    sent = {name: sum(bytes_sent for bytes_sent, _ in stats[name]) for name in stats}
    for name in stats:
        assert sent[name] == remote * (8 + wire.row_bytes(name, NUM_FEATURES))
    replies = {name: sent[name] - 8 * remote for name in stats}
    ratio = {"float16": 1 / 2, "bfloat16": 1 / 2, "int8": (NUM_FEATURES + 4) / (4 * NUM_FEATURES)}[dtype]
    assert replies[dtype] / replies["float32"] == pytest.approx(ratio)


def round_checks(rank: int) -> dict[str, Any]:
    """``gather`` in rounds of a few rows (``ROUND_BYTES`` made tiny), ranks asking for different numbers of rows,
    every wire dtype, the 2-D table and a 1-D one; with the all-to-alls it took."""
    from gnnscale.distributed import comm
    from gnnscale.distributed.comm import Exchanger
    from gnnscale.distributed.env import init_runtime, read_env
    from gnnscale.distributed.feature_store import DistTable

    runtime = init_runtime(read_env(), timeout=60.0)
    try:
        exchanger = Exchanger(runtime.sample_group, rank, runtime.world_size)
        DistTable.ROUND_BYTES = 2 * 4 * NUM_FEATURES * 3  # 3 float32 rows per peer and round on 2 ranks
        start, end = OFFSETS[rank], OFFSETS[rank + 1]
        full = every_row()
        ids = torch.from_numpy(np.random.default_rng(rank).integers(0, OFFSETS[-1], 40 + 25 * rank))
        out: dict[str, Any] = {"ids": ids}
        for dtype in wire.WIRE_DTYPES:
            table = DistTable(full[start:end].clone(), torch.tensor(OFFSETS), exchanger, wire_dtype=dtype)
            exchanger.stats.reset()
            rows = table.gather(ids)
            column = DistTable(full[start:end, 0].clone(), torch.tensor(OFFSETS), exchanger, wire_dtype=dtype)
            out[dtype] = {"rows": rows, "exchanges": exchanger.stats.exchanges, "column": column.gather(ids)}
            comm.release_kept()  # (no group is destroyed meanwhile) what the next gathers pin, alone
            with table.reusing_buffers():  # evaluation's waves: several gathers through one set of buffers
                out[dtype]["reused"] = [table.gather(ids), table.gather(ids[::3])]
                out[dtype]["pinned"] = len({t.untyped_storage().data_ptr() for t in comm._KEPT if t.dim() == 2})
        return out
    finally:
        runtime.close()


def test_a_large_gather_runs_in_rounds_and_returns_every_row() -> None:
    """A gather bigger than ``ROUND_BYTES`` goes in several all-to-alls through reused buffers (evaluation's halo
    rows held about 880 MiB a rank of transients in one): every row arrives, exactly in float32, within the
    codec's bound otherwise, whatever the ranks' different numbers of rounds."""
    full = every_row()
    results = run_ranks(round_checks, 2, timeout=120.0)
    for rank, result in enumerate(results):
        wanted = full[result["ids"]]
        for dtype in wire.WIRE_DTYPES:
            got = result[dtype]
            # The requests' exchange and at least ceil(remote rows / rows per round) rounds, not one.
            remote = int(((result["ids"] < OFFSETS[rank]) | (result["ids"] >= OFFSETS[rank + 1])).sum())
            per_round = 2 * 4 * NUM_FEATURES * 3 // (2 * wire.row_bytes(dtype, NUM_FEATURES))
            assert got["exchanges"] >= 1 + -(-remote // per_round) > 2, (rank, dtype, got["exchanges"])
            assert got["pinned"] == 2, (rank, dtype, got["pinned"])  # one send and one receive buffer, not two each
            assert torch.equal(got["reused"][0], got["rows"]) and torch.equal(got["reused"][1], got["rows"][::3])
            for rows, expected in ((got["rows"], wanted), (got["column"].unsqueeze(1), wanted[:, :1])):
                if dtype == "float32":
                    assert torch.equal(rows, expected), rank
                else:
                    assert (rows_error(rows, expected) <= wire.error_bound(dtype, expected)).all(), (rank, dtype)
