"""The planted-community generator: structure, determinism, learnability, locality, config errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gnnscale.data.dataset import GraphDataset
from gnnscale.data import synthetic
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

# 100 communities of 200 nodes, 10 per label: small enough to build in ~0.1 s,
# big enough for the statistics below to be stable.
SMALL = dict(num_nodes=20_000, community_size=200, feat_dim=32)


@pytest.fixture(scope="module")
def small() -> GraphDataset:
    return generate_synthetic(SyntheticConfig(**SMALL))


def edge_keys(ds: GraphDataset) -> tuple[np.ndarray, np.ndarray]:
    """int64 [E] ``dst * N + src`` in stored order, and the same keys for the reversed edges, sorted."""
    src, dst = ds.edges()
    return dst * ds.num_nodes + src, np.sort(src * ds.num_nodes + dst)


def nearest_centroid_accuracy(x: np.ndarray, ds: GraphDataset) -> float:
    """Test accuracy of the nearest class mean (means from training nodes): the Bayes rule
    for isotropic Gaussian classes, so no model does much better on ``x`` alone."""
    train, _, test = ds.split(0)
    means = np.stack([x[train & (ds.labels == c)].mean(axis=0) for c in range(ds.num_classes)])
    dist = (x[test] ** 2).sum(1)[:, None] - 2 * x[test] @ means.T + (means ** 2).sum(1)[None, :]
    return float((dist.argmin(axis=1) == ds.labels[test]).mean())


# ---------------------------------------------------------------------- structure
def test_shapes_and_dtypes(small: GraphDataset) -> None:
    n = SMALL["num_nodes"]
    assert (small.name, small.metric, small.num_classes) == ("synthetic", "accuracy", 10)
    assert small.indptr.shape == (n + 1,) and small.indptr.dtype == np.int64
    assert small.indices.dtype == np.int64
    assert small.features.shape == (n, 32) and small.features.dtype == np.float32
    assert small.labels.shape == (n,) and small.labels.dtype == np.int64
    assert small.train_masks.shape == small.val_masks.shape == small.test_masks.shape == (1, n)
    assert small.extra["community"].shape == (n,) and small.extra["num_communities"] == 100
    assert set(np.unique(small.labels)) == set(range(10))


def test_simple_symmetric_graph(small: GraphDataset) -> None:
    keys, reversed_keys = edge_keys(small)
    src, dst = small.edges()
    assert not np.any(src == dst), "self loops must be dropped"
    assert np.all(np.diff(keys) > 0), "in-edges must be grouped by destination, sorted, and without repeats"
    np.testing.assert_array_equal(keys, reversed_keys)  # keys are sorted, so this is symmetry


def test_average_degree_close_to_requested(small: GraphDataset) -> None:
    assert small.num_edges / small.num_nodes == pytest.approx(10.0, rel=0.005)
    ds = generate_synthetic(SyntheticConfig(**{**SMALL, "avg_degree": 3.0}))
    assert ds.num_edges / ds.num_nodes == pytest.approx(3.0, rel=0.005)


def test_power_law_degrees(small: GraphDataset) -> None:
    degrees = small.in_degrees()
    assert degrees.max() > 20 * degrees.mean()
    assert np.median(degrees) < degrees.mean()  # a long right tail
    capped = generate_synthetic(SyntheticConfig(**{**SMALL, "max_degree": 50.0})).in_degrees()
    assert capped.max() < 1.5 * 50


def test_heavy_tail_near_exponent_one_stays_finite() -> None:
    ds = generate_synthetic(SyntheticConfig(**{**SMALL, "degree_exponent": 1.01, "max_degree": 100.0}))
    assert ds.num_edges / ds.num_nodes == pytest.approx(10.0, rel=0.01)
    assert ds.in_degrees().max() < 1.5 * 100


def test_masks_disjoint_with_requested_sizes(small: GraphDataset) -> None:
    train, val, test = small.split(0)
    assert not (train & val).any() and not (train & test).any() and not (val & test).any()
    n = small.num_nodes
    assert (train.sum(), val.sum(), test.sum()) == (round(0.1 * n), round(0.1 * n), round(0.8 * n))
    ds = generate_synthetic(SyntheticConfig(**{**SMALL, "train_fraction": 0.5, "val_fraction": 0.2,
                                               "test_fraction": 0.1}))
    assert [int(m.sum()) for m in ds.split(0)] == [10_000, 4_000, 2_000]


# ---------------------------------------------------------------------- determinism
def test_same_seed_same_dataset(small: GraphDataset) -> None:
    again = generate_synthetic(SyntheticConfig(**SMALL))
    for name in ("indptr", "indices", "features", "labels", "train_masks", "val_masks", "test_masks"):
        np.testing.assert_array_equal(getattr(again, name), getattr(small, name), err_msg=name)


def test_other_seed_other_dataset(small: GraphDataset) -> None:
    other = generate_synthetic(SyntheticConfig(**SMALL, seed=1))
    assert other.num_edges != small.num_edges or not np.array_equal(other.indices, small.indices)
    assert not np.array_equal(other.labels, small.labels)
    assert not np.array_equal(other.features, small.features)
    assert not np.array_equal(other.train_masks, small.train_masks)


def test_chunk_size_does_not_change_the_graph() -> None:
    # Several 65,536-node seed blocks, so a small chunk really splits the work.
    config = dict(num_nodes=200_000, avg_degree=4.0, feat_dim=2)
    whole = generate_synthetic(SyntheticConfig(**config))
    chunked = generate_synthetic(SyntheticConfig(**config, chunk_edges=1))
    np.testing.assert_array_equal(whole.indptr, chunked.indptr)
    np.testing.assert_array_equal(whole.indices, chunked.indices)
    np.testing.assert_array_equal(whole.features, chunked.features)


# ---------------------------------------------------------------------- planted structure
def test_homophily(small: GraphDataset) -> None:
    src, dst = small.edges()
    same_label = (small.labels[src] == small.labels[dst]).mean()
    # intra + (1 - intra) * (same_label + (1 - same_label) / K) = 0.874 before repeats are dropped.
    assert 0.8 < same_label < 0.9


def test_edges_inside_communities_follow_intra_fraction(small: GraphDataset) -> None:
    community = small.extra["community"]
    src, dst = small.edges()
    # Repeats are likelier inside a community, so dropping them lowers the share a little.
    assert (community[src] == community[dst]).mean() == pytest.approx(0.8, abs=0.05)
    loose = generate_synthetic(SyntheticConfig(**{**SMALL, "intra_fraction": 0.3}))
    src, dst = loose.edges()
    assert (loose.extra["community"][src] == loose.extra["community"][dst]).mean() == pytest.approx(0.3, abs=0.03)


def test_communities_are_not_id_ranges(small: GraphDataset) -> None:
    community = small.extra["community"]
    assert np.bincount(community).min() == np.bincount(community).max() == 200
    assert (community[1:] == community[:-1]).mean() < 0.05


def test_neighbour_averaging_beats_features_alone(small: GraphDataset) -> None:
    x = small.features.astype(np.float64)
    src, dst = small.edges()
    mean = x.copy()
    np.add.at(mean, dst, x[src])
    mean /= (small.in_degrees() + 1)[:, None]
    features_only, with_neighbours = nearest_centroid_accuracy(x, small), nearest_centroid_accuracy(mean, small)
    assert features_only < 0.6
    assert with_neighbours > 0.85
    assert with_neighbours - features_only > 0.3


def test_metis_finds_the_communities(small: GraphDataset) -> None:
    pymetis = pytest.importorskip("pymetis")
    _, parts = pymetis.part_graph(4, adjacency=pymetis.CSRAdjacency(small.indptr, small.indices))
    parts = np.asarray(parts)
    src, dst = small.edges()
    cut = (parts[src] != parts[dst]).mean()
    assert cut < 0.25, f"METIS cut {cut:.3f} of the edges; a random 4-way split cuts ~0.75"


def test_noise_free_features_are_unit_centroids() -> None:
    ds = generate_synthetic(SyntheticConfig(**{**SMALL, "feature_noise": 0.0}))
    centroids = np.stack([ds.features[ds.labels == c][0] for c in range(10)])
    np.testing.assert_allclose(centroids @ centroids.T, np.eye(10), atol=1e-5)
    few = generate_synthetic(SyntheticConfig(**{**SMALL, "feature_noise": 0.0, "feat_dim": 3}))
    np.testing.assert_allclose(np.linalg.norm(few.features, axis=1), 1.0, atol=1e-5)


# ---------------------------------------------------------------------- config errors
@pytest.mark.parametrize(("field", "value", "match"), [
    ("num_nodes", 1, r"num_nodes=1 is invalid: expected an int in \[2, 2\*\*31 - 1\]"),
    ("num_nodes", 2**31, r"num_nodes=2147483648 is invalid"),
    ("avg_degree", 0.0, r"avg_degree=0.0 is invalid: expected > 0"),
    ("avg_degree", float("nan"), r"avg_degree=nan is invalid"),
    ("avg_degree", 100.0, r"avg_degree=100.0 is invalid: .*communities stay sparse; raise community_size"),
    ("num_classes", 1, r"num_classes=1 is invalid: expected >= 2"),
    ("num_classes", 200, r"community_size=200 is invalid: expected about num_nodes / num_classes = 100 or less, "
                         r"so that every one of the 200 classes gets a community; lower community_size"),
    ("feat_dim", 0, r"feat_dim=0 is invalid: expected >= 1"),
    ("seed", -1, r"seed=-1 is invalid: expected >= 0"),
    ("community_size", 1, r"community_size=1 is invalid: expected in \[2, num_nodes=20000\]"),
    ("community_size", 30_000, r"community_size=30000 is invalid"),
    ("intra_fraction", 1.5, r"intra_fraction=1.5 is invalid: expected a number in \[0, 1\]"),
    ("same_label_fraction", -0.1, r"same_label_fraction=-0.1 is invalid: expected a number in \[0, 1\]"),
    ("degree_exponent", 1.0, r"degree_exponent=1.0 is invalid: expected > 1"),
    ("max_degree", 5.0, r"max_degree=5.0 is invalid: expected >= avg_degree = 10.0; raise max_degree"),
    ("feature_noise", -1.0, r"feature_noise=-1.0 is invalid: expected >= 0"),
    ("train_fraction", 0.0, r"train_fraction=0.0 is invalid: expected > 0"),
    ("val_fraction", 2.0, r"val_fraction=2.0 is invalid: expected a number in \[0, 1\]"),
    ("test_fraction", 0.9, r"train_fraction \+ val_fraction \+ test_fraction=1.1 is invalid: expected <= 1; shrink"),
    ("chunk_edges", 0, r"chunk_edges=0 is invalid: expected >= 1"),
])
def test_bad_config_raises(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SyntheticConfig(**{**SMALL, field: value})


def test_dense_graph_rejected() -> None:
    with pytest.raises(ValueError, match=r"avg_degree=10.0 is invalid: expected <= \(num_nodes - 1\) / 4"):
        SyntheticConfig(num_nodes=30, community_size=15, num_classes=2, avg_degree=10.0, intra_fraction=0.0)


@pytest.mark.parametrize(("field", "value"), [("num_nodes", 1000.0), ("seed", True), ("chunk_edges", "10")])
def test_non_integer_counts_raise_type_error(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=rf"SyntheticConfig.{field} must be an int, got {value!r}"):
        SyntheticConfig(**{**SMALL, field: value})


def test_warns_when_same_label_fraction_has_no_effect() -> None:
    with pytest.warns(UserWarning, match=r"same_label_fraction=0.3 has no effect on 10 of the 10 classes"):
        SyntheticConfig(num_nodes=2_000, community_size=200)
    with pytest.warns(UserWarning, match=r"has no effect on 5 of the 10 classes: they have a single community"):
        SyntheticConfig(num_nodes=3_000, community_size=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SyntheticConfig(num_nodes=2_000, community_size=200, same_label_fraction=0.0)


def test_warns_when_requested_degree_is_not_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without top-up rounds the ~15% of repeated pairs in small communities stay missing.
    monkeypatch.setattr(synthetic, "_MAX_TOP_UP_ROUNDS", 0)
    with pytest.warns(UserWarning, match=r"average degree 8\.\d+, short of the requested avg_degree=10.0: too many"):
        ds = generate_synthetic(SyntheticConfig(**SMALL))
    assert ds.num_edges / ds.num_nodes < 9.0
