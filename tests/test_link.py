"""Link prediction pieces in one process: seed-edge exclusion, negatives, link batches, the edge split,
ranking metrics and decoders."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnscale.batch import LinkMiniBatch
from gnnscale.data.dataset import csc_from_edges
from gnnscale.data.link_split import random_link_split, undirected_pairs
from gnnscale.metrics import hits_at_k, link_ranks, mean_reciprocal_rank, roc_auc
from gnnscale.nn.link import DotDecoder, MLPDecoder, link_loss, make_decoder
from gnnscale.pipeline.loader import LoaderConfig, PrefetchLoader
from samplers import NeighborSampler, SamplerConfig
from samplers.link import LinkSampler, NegativeSampler, excluded_edges
from samplers.neighbor import exclusion_keys


def ring_with_chords(num_nodes: int = 60, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A symmetric graph: a ring plus random chords, so degrees vary and every node has neighbours."""
    rng = np.random.default_rng(seed)
    ring = np.arange(num_nodes)
    src = np.concatenate([ring, rng.integers(0, num_nodes, 3 * num_nodes)])
    dst = np.concatenate([(ring + 1) % num_nodes, rng.integers(0, num_nodes, 3 * num_nodes)])
    return csc_from_edges(src, dst, num_nodes, symmetrize=True)


def block_edges(batch, layers: slice = slice(None)) -> set[tuple[int, int]]:
    """Every (src, dst) global pair in the blocks of ``batch`` (those of ``layers``)."""
    pairs = set()
    for block in batch.blocks[layers]:
        src = block.src_ids[block.indices].tolist()
        dst = block.src_ids[block.dst_index()].tolist()
        pairs.update(zip(src, dst))
    return pairs


# ---------------------------------------------------------------------- exclusion
def test_full_fanout_exclusion_removes_exactly_the_excluded_edges():
    indptr, indices = ring_with_chords()
    sampler = NeighborSampler(indptr, indices, SamplerConfig(fanouts=[-1, -1]))
    seeds = torch.tensor([3, 4, 10])
    exclude = torch.tensor([[3, 4, 9], [4, 3, 10]])
    plain = sampler.sample(seeds, rng=np.random.default_rng(0))
    cut = sampler.sample(seeds, rng=np.random.default_rng(0), exclude=exclude)
    banned = set(zip(exclude[0].tolist(), exclude[1].tolist()))
    assert banned <= block_edges(plain)
    assert not banned & block_edges(cut)
    # The seeds' own block loses exactly the excluded edges (the next hop then has fewer sources to expand).
    assert block_edges(cut, slice(-1, None)) == block_edges(plain, slice(-1, None)) - banned
    # The last block's destinations lose exactly their excluded in-edges.
    lost = plain.blocks[-1].in_degrees() - cut.blocks[-1].in_degrees()
    assert lost.tolist() == [1, 1, 1]


def test_sampled_fanout_never_returns_an_excluded_edge_and_is_deterministic():
    indptr, indices = ring_with_chords(200, seed=1)
    sampler = NeighborSampler(indptr, indices, SamplerConfig(fanouts=[3, 2]))
    seeds = torch.arange(0, 200, 7)
    # Exclude every in-edge of the seeds: their blocks must be empty whatever the draw.
    dst = np.repeat(np.arange(200), np.diff(indptr))
    chosen = np.isin(dst, seeds.numpy())
    exclude = torch.from_numpy(np.stack([indices[chosen], dst[chosen]]))
    batch = sampler.sample(seeds, rng=np.random.default_rng(5), exclude=exclude)
    assert batch.blocks[-1].num_edges == 0
    again = sampler.sample(seeds, rng=np.random.default_rng(5), exclude=exclude)
    for a, b in zip(batch.blocks, again.blocks):
        assert torch.equal(a.indices, b.indices) and torch.equal(a.src_ids, b.src_ids)


def test_exclusion_input_errors():
    with pytest.raises(ValueError, match=r"exclude must be int64 \[2, k\]"):
        exclusion_keys(np.zeros((3, 2), dtype=np.int64), 10)
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        exclusion_keys(np.array([[1], [10]]), 10)


# ---------------------------------------------------------------------- negatives
def test_uniform_negatives_keep_sources_and_are_seeded():
    sampler = NegativeSampler(50, num_negatives=3)
    src = torch.tensor([1, 2, 3])
    neg = sampler(src, np.random.default_rng(0))
    assert neg.shape == (2, 9)
    assert neg[0].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert ((neg[1] >= 0) & (neg[1] < 50)).all()
    assert torch.equal(neg, sampler(src, np.random.default_rng(0)))


def test_global_negatives_draw_both_ends():
    sampler = NegativeSampler(1000, num_negatives=2, mode="global")
    neg = sampler(torch.tensor([5, 5, 5]), np.random.default_rng(0))
    assert neg.shape == (2, 6) and (neg[0] != 5).any() and ((neg >= 0) & (neg < 1000)).all()


def test_degree_negatives_follow_the_powered_degrees():
    degrees = np.array([0, 1, 4, 9], dtype=np.int64)
    sampler = NegativeSampler(4, num_negatives=40_000, mode="degree", degrees=degrees, power=0.5)
    drawn = sampler(torch.tensor([0]), np.random.default_rng(1))[1].numpy()
    frequency = np.bincount(drawn, minlength=4) / drawn.size
    np.testing.assert_allclose(frequency, [0, 1 / 6, 2 / 6, 3 / 6], atol=0.01)  # sqrt(degree) / 6


@pytest.mark.parametrize("kwargs, message", [
    ({"num_nodes": 0}, "num_nodes must be >= 1"),
    ({"num_nodes": 5, "num_negatives": 0}, "num_negatives must be >= 1"),
    ({"num_nodes": 5, "mode": "hard"}, "negative_sampling must be one of"),
    ({"num_nodes": 5, "mode": "degree"}, "needs degrees="),
    ({"num_nodes": 2, "mode": "degree", "degrees": np.zeros(2)}, "not all zero"),
])
def test_negative_sampler_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NegativeSampler(**kwargs)


# ---------------------------------------------------------------------- link batches
def make_link_sampler(exclude: str = "reverse", fanouts=(-1, -1)) -> tuple[LinkSampler, torch.Tensor]:
    indptr, indices = ring_with_chords(80, seed=2)
    dst = np.repeat(np.arange(80), np.diff(indptr))
    once = indices < dst
    edges = torch.from_numpy(np.stack([indices[once], dst[once]]))
    nodes = NeighborSampler(indptr, indices, SamplerConfig(fanouts=list(fanouts)))
    return LinkSampler(nodes.sample, edges, NegativeSampler(80, num_negatives=2), exclude=exclude), edges


@pytest.mark.parametrize("exclude", ["reverse", "self", "none"])
def test_link_batch_pairs_point_at_their_endpoints_and_seed_edges_are_excluded(exclude):
    sampler, edges = make_link_sampler(exclude)
    positions = torch.arange(0, edges.shape[1], 5)
    batch = sampler(positions, rng=np.random.default_rng(3))
    assert isinstance(batch, LinkMiniBatch)
    assert torch.equal(batch.seeds[batch.pos], edges[:, positions])
    assert batch.neg.shape == (2, 2 * positions.numel())
    assert torch.equal(batch.seeds[batch.neg[0]], edges[0, positions].repeat_interleave(2))
    assert torch.equal(batch.seeds, torch.unique(batch.seeds))
    seen = block_edges(batch)
    forward = set(zip(*edges[:, positions].tolist()))
    backward = {(v, u) for u, v in forward}
    assert not (forward & seen) if exclude != "none" else forward <= seen
    assert not (backward & seen) if exclude == "reverse" else backward <= seen


def test_link_batch_save_load_and_to_round_trip(tmp_path):
    sampler, edges = make_link_sampler(fanouts=(4, 3))
    batch = sampler(torch.arange(10), rng=np.random.default_rng(0))
    batch.save(tmp_path / "b.pt")
    loaded = LinkMiniBatch.load(tmp_path / "b.pt")
    moved = loaded.to("cpu")
    assert isinstance(moved, LinkMiniBatch)
    assert torch.equal(moved.pos, batch.pos) and torch.equal(moved.neg, batch.neg)
    assert torch.equal(moved.blocks[0].indices, batch.blocks[0].indices)


def test_link_sampler_errors():
    nodes = NeighborSampler(*ring_with_chords(10), SamplerConfig(fanouts=[2]))
    with pytest.raises(ValueError, match="exclude must be one of"):
        LinkSampler(nodes.sample, torch.zeros((2, 1), dtype=torch.int64), NegativeSampler(10), exclude="both")
    with pytest.raises(ValueError, match=r"edges must be int64 \[2, E\]"):
        LinkSampler(nodes.sample, torch.zeros(4, dtype=torch.int64), NegativeSampler(10))
    assert excluded_edges(torch.tensor([[1], [2]]), "none") is None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_prefetch_loader_drives_link_batches_without_labels(num_workers):
    sampler, edges = make_link_sampler(fanouts=(3, 3))
    features = torch.randn(80, 4)
    config = LoaderConfig(batch_size=16, num_workers=num_workers, seed=7)
    loader = PrefetchLoader(sampler, torch.arange(edges.shape[1]), features, None, config)
    batches = list(loader)
    assert len(batches) == len(loader)
    covered = torch.cat([b.batch.seeds[b.batch.pos].T for b in batches])
    assert sorted(map(tuple, covered.tolist())) == sorted(map(tuple, edges.T.tolist()))
    for loaded in batches[-2:]:  # only the last two batches' buffers are still valid
        assert loaded.y is None
        assert torch.equal(loaded.x, features[loaded.batch.input_ids])
    loader.epoch = 0
    again = list(loader)
    assert all(torch.equal(a.batch.neg, b.batch.neg)
               and torch.equal(a.batch.blocks[0].indices, b.batch.blocks[0].indices) for a, b in zip(batches, again))


# ---------------------------------------------------------------------- split
def test_random_link_split_matches_pygs_semantics():
    indptr, indices = ring_with_chords(300, seed=4)
    dst = np.repeat(np.arange(300), np.diff(indptr))
    split = random_link_split(indices, dst, 300, num_val=0.05, num_test=0.1, seed=3)
    pairs = undirected_pairs(indices, dst)
    total = pairs.shape[1]
    assert split.val_pos.shape[1] == int(0.05 * total) and split.test_pos.shape[1] == int(0.1 * total)
    assert split.val_neg.shape == split.val_pos.shape and split.test_neg.shape == split.test_pos.shape
    keys = lambda e: set(zip(*np.sort(e, axis=0).tolist()))  # noqa: E731 -- undirected view
    parts = [keys(split.train_pos), keys(split.val_pos), keys(split.test_pos)]
    assert sum(map(len, parts)) == total and set().union(*parts) == keys(pairs)
    negatives = keys(np.concatenate([split.val_neg, split.test_neg], axis=1))
    assert not negatives & keys(pairs) and (split.val_neg[0] != split.val_neg[1]).all()
    # Messages: train edges at train/val time; train + val at test time; both directions.
    train_mp = set(zip(*split.message_edges("train").tolist()))
    test_mp = set(zip(*split.message_edges("test").tolist()))
    assert len(train_mp) == 2 * len(parts[0]) and len(test_mp) == 2 * (len(parts[0]) + len(parts[1]))
    assert {(v, u) for u, v in train_mp} == train_mp
    mp_indptr, _ = split.message_graph("val")
    assert mp_indptr[-1] == 2 * len(parts[0])
    again = random_link_split(indices, dst, 300, num_val=0.05, num_test=0.1, seed=3)
    assert np.array_equal(again.test_pos, split.test_pos) and np.array_equal(again.test_neg, split.test_neg)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_val": 1.0}, r"num_val must be a fraction in \[0, 1\)"),
    ({"num_test": -0.1}, r"num_test must be a fraction"),
    ({"num_val": 0.7, "num_test": 0.7}, "leave no training edge"),
])
def test_random_link_split_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        random_link_split(np.array([0, 1, 2]), np.array([1, 2, 3]), 4, **kwargs)


def test_random_link_split_refuses_bad_ids_and_stage():
    with pytest.raises(ValueError, match="num_nodes is 3"):
        random_link_split(np.array([0, 1]), np.array([1, 3]), 3)
    with pytest.raises(ValueError, match="too few non-edges"):
        random_link_split(np.array([0, 0, 1]), np.array([1, 2, 2]), 3, num_val=0.4)
    split = random_link_split(np.array([0, 1, 2]), np.array([1, 2, 3]), 10, num_val=0.0, num_test=0.0)
    with pytest.raises(ValueError, match="stage must be"):
        split.message_edges("predict")


# ---------------------------------------------------------------------- metrics
def test_ranks_mrr_and_hits_per_positive_negatives():
    positive = torch.tensor([0.9, 0.5, 0.2])
    negatives = torch.tensor([[0.1, 0.2, 0.3], [0.6, 0.7, 0.1], [0.2, 0.8, 0.9]])
    # ranks: 1; 3 (two higher); 1 + 2 higher + half of one tie = 3.5
    assert link_ranks(positive, negatives).tolist() == [1.0, 3.0, 3.5]
    assert mean_reciprocal_rank(positive, negatives) == pytest.approx((1 + 1 / 3 + 1 / 3.5) / 3)
    assert hits_at_k(positive, negatives, 1) == pytest.approx(1 / 3)
    assert hits_at_k(positive, negatives, 3) == pytest.approx(2 / 3)


def test_ranks_mrr_and_hits_shared_negatives():
    positive = torch.tensor([0.9, 0.5, 0.2])
    shared = torch.tensor([0.6, 0.2, 0.1, 0.7])
    # ranks against all four: 1; 3; 3 + half a tie = 3.5
    assert link_ranks(positive, shared).tolist() == [1.0, 3.0, 3.5]
    assert mean_reciprocal_rank(positive, shared) == pytest.approx((1 + 1 / 3 + 1 / 3.5) / 3)
    # OGB collab: the 2nd highest negative is 0.6; positives strictly above it: 0.9 only.
    assert hits_at_k(positive, shared, 2) == pytest.approx(1 / 3)
    assert hits_at_k(positive, shared, 3) == pytest.approx(2 / 3)  # 3rd highest is 0.2, a tie is no hit
    assert hits_at_k(positive, shared, 10) == 1.0  # fewer negatives than K
    with pytest.raises(ValueError, match="k must be >= 1"):
        hits_at_k(positive, shared, 0)
    assert np.isnan(hits_at_k(torch.tensor([]), shared, 2))
    assert roc_auc(torch.cat([positive, shared]), torch.tensor([1, 1, 1, 0, 0, 0, 0])) == pytest.approx(7.5 / 12)


# ---------------------------------------------------------------------- decoders
def test_decoders_score_pairs():
    h = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]])
    pairs = torch.tensor([[0, 1], [2, 0]])
    assert DotDecoder()(h, pairs).tolist() == [1.5, 1.0]
    mlp = MLPDecoder(2, hidden=8, num_layers=3)
    scores = mlp(h, pairs)
    assert scores.shape == (2,)
    assert torch.allclose(mlp(h, pairs.flip(0)), scores)  # symmetric in the pair
    assert isinstance(make_decoder("mlp", 2), MLPDecoder)
    loss = link_loss(torch.tensor([10.0]), torch.tensor([-10.0]))
    assert loss.item() == pytest.approx(0.0, abs=1e-4)


def test_decoder_errors():
    with pytest.raises(ValueError, match="decoder must be 'dot' or 'mlp'"):
        make_decoder("bilinear", 4)
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        MLPDecoder(4, num_layers=0)
    with pytest.raises(ValueError, match="dim and hidden must be >= 1"):
        MLPDecoder(0)


def test_exclusion_keeps_sampled_edge_ids_with_their_edges():
    indptr, indices = ring_with_chords(60, seed=3)
    sampler = NeighborSampler(indptr, indices, SamplerConfig(fanouts=[-1], edge_ids=True))
    exclude = torch.tensor([[3, 4], [4, 3]])
    block = sampler.sample(torch.tensor([3, 4, 20]), rng=np.random.default_rng(0), exclude=exclude).blocks[0]
    assert block.edge_ids.numel() == block.num_edges
    dst = np.repeat(np.arange(60), np.diff(indptr))
    # Edge id i is the i-th stored in-edge: its endpoints must be the block's edge's endpoints.
    src_ids, dst_ids = block.src_ids[block.indices], block.src_ids[block.dst_index()]
    assert np.array_equal(indices[block.edge_ids.numpy()], src_ids.numpy())
    assert np.array_equal(dst[block.edge_ids.numpy()], dst_ids.numpy())
    assert not {(3, 4), (4, 3)} & set(zip(src_ids.tolist(), dst_ids.tolist()))
