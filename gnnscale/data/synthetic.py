"""Synthetic node-classification graphs with planted communities.

A random graph (``dgl.rand_graph``) has neither learnable labels nor locality, so it says nothing
about accuracy and flatters no partitioner.  This generator plants both:

* **Communities.**  Nodes fall into ``num_nodes / community_size`` equal communities.  Node ids are
  a random permutation, so a community is *not* a contiguous id range: a partitioner has to find
  it from the edges.
* **Labels.**  Each community carries one label; communities are spread evenly over the
  ``num_classes`` labels (``label(c) = c * num_classes // num_communities``).
* **Edges** come from a degree-corrected stochastic block model.  Every node has a power-law weight
  ``theta`` (exponent ``degree_exponent``, expected degree capped at ``max_degree``).  One endpoint
  of each sampled pair is drawn from all nodes in proportion to ``theta``; the other, again in
  proportion to ``theta``, from

  - the same community, with probability ``intra_fraction``;
  - another community *of the same label*, with probability
    ``(1 - intra_fraction) * same_label_fraction`` -- so inter-community edges still favour the own
    class (homophily), as citation and co-purchase graphs do;
  - any node, otherwise (a degree-corrected Erdos-Renyi background).

  Both directions are stored; self-loops and repeats are dropped, and a few extra pairs are drawn
  to make up for them, so the average degree is close to ``avg_degree``.  Edges join equal labels
  with probability about ``intra + (1 - intra) * (same_label + (1 - same_label) / num_classes)``.
* **Features** are the class centroid plus isotropic Gaussian noise.  Centroids are orthonormal
  (when ``feat_dim >= num_classes``), so how hard the features are alone depends on
  ``feature_noise`` only, not on ``feat_dim``.  With the defaults a nearest-centroid classifier (the
  best any model can do on features alone) scores about 45%, and the same classifier on
  neighbour-averaged features about 90%: a GNN has something to learn that an MLP cannot.

Sampling is vectorised over a label- and community-major layout (:class:`_Layout`).  Randomness
comes from one ``np.random.SeedSequence(seed)`` child per fixed block of 65,536 positions (or
feature rows), so ``chunk_edges`` bounds memory without changing the graph.  Example::

    ds = generate_synthetic(SyntheticConfig(num_nodes=1_000_000, avg_degree=10))
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from gnnscale.data.dataset import GraphDataset

# Positions (or feature rows) drawn from one child seed; fixed, so the output does not depend on chunking.
_BLOCK = 1 << 16
# Stop topping up once this fraction of the requested pairs is missing.
_DEGREE_TOLERANCE = 1e-3
_MAX_TOP_UP_ROUNDS = 4


@dataclass(kw_only=True)
class SyntheticConfig:
    """How to generate a planted-community graph; see the module docstring for the model."""

    num_nodes: int = 100_000
    """Number of nodes, in ``[2, 2**31 - 1]`` (node ids are held as int32 while sampling)."""
    avg_degree: float = 10.0
    """Average number of neighbours per node: about ``num_nodes * avg_degree`` directed edges."""
    num_classes: int = 10
    """Number of label classes, >= 2."""
    feat_dim: int = 100
    """Feature dimension, >= 1."""
    seed: int = 0
    """Non-negative seed; equal configs give identical datasets."""
    community_size: int | None = None
    """Nodes per planted community (give or take one); many small ones give METIS something to cut
    between.  ``None`` picks ``min(1000, num_nodes // (4 * num_classes))``, at least 2."""
    intra_fraction: float = 0.8
    """Fraction of sampled edges that join two nodes of the same community, in [0, 1]."""
    same_label_fraction: float = 0.3
    """Of the inter-community edges, the fraction to another community of the same label; in [0, 1]."""
    degree_exponent: float = 2.5
    """Exponent ``g`` of the power-law degree distribution ``P(k) ~ k**-g``; > 1."""
    max_degree: float = 1000.0
    """Cap on a node's expected degree; hubs above it are flattened.  >= avg_degree."""
    feature_noise: float = 0.7
    """Standard deviation of the Gaussian noise per feature (centroids are sqrt(2) apart); >= 0."""
    train_fraction: float = 0.1
    """Fraction of nodes in the training mask (random, by seed); in (0, 1]."""
    val_fraction: float = 0.1
    """Fraction of nodes in the validation mask; in [0, 1]."""
    test_fraction: float = 0.8
    """Fraction of nodes in the test mask; in [0, 1].  The three fractions sum to <= 1."""
    chunk_edges: int = 1 << 23
    """About how many node pairs to sample per vectorised step (at least one block of 65,536 nodes):
    bounds the sampling memory at about 80 bytes per pair; does not change the graph."""

    def __post_init__(self) -> None:
        if self.community_size is None and isinstance(self.num_nodes, int) and isinstance(self.num_classes, int):
            self.community_size = max(2, min(1000, self.num_nodes // max(1, 4 * self.num_classes)))
        for name in ("num_nodes", "num_classes", "feat_dim", "seed", "community_size", "chunk_edges"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"SyntheticConfig.{name} must be an int, got {value!r} "
                                f"({type(value).__name__}); pass a whole number")
        _require(2 <= self.num_nodes <= 2**31 - 1, "num_nodes", self.num_nodes, "an int in [2, 2**31 - 1]",
                 "pick a graph size in that range")
        _require(self.num_classes >= 2, "num_classes", self.num_classes, ">= 2", "use at least two classes")
        _require(self.feat_dim >= 1, "feat_dim", self.feat_dim, ">= 1", "use at least one feature")
        _require(self.seed >= 0, "seed", self.seed, ">= 0", "use a non-negative seed")
        _require(2 <= self.community_size <= self.num_nodes, "community_size", self.community_size,
                 f"in [2, num_nodes={self.num_nodes}]", "pick a community size no larger than the graph")
        _require(self.num_communities >= self.num_classes, "community_size", self.community_size,
                 f"about num_nodes / num_classes = {self.num_nodes // self.num_classes} or less, so that every one "
                 f"of the {self.num_classes} classes gets a community",
                 "lower community_size or num_classes, or raise num_nodes")
        _require(self.chunk_edges >= 1, "chunk_edges", self.chunk_edges, ">= 1", "use e.g. 1 << 23")
        for name in ("intra_fraction", "same_label_fraction", "train_fraction", "val_fraction", "test_fraction"):
            value = getattr(self, name)
            _require(_is_real(value) and 0.0 <= value <= 1.0, name, value, "a number in [0, 1]",
                     "pass a fraction")
        _require(self.train_fraction > 0, "train_fraction", self.train_fraction, "> 0",
                 "train on at least some nodes")
        total = self.train_fraction + self.val_fraction + self.test_fraction
        _require(total <= 1.0 + 1e-9, "train_fraction + val_fraction + test_fraction", round(total, 6), "<= 1",
                 "shrink one of the split fractions")
        _require(_is_real(self.avg_degree) and self.avg_degree > 0, "avg_degree", self.avg_degree, "> 0",
                 "use e.g. 10.0")
        # Intra-community pairs must stay sparse, or dropping repeats would make the degree unreachable.
        intra_degree = self.avg_degree * self.intra_fraction
        _require(intra_degree <= 0.25 * (self.community_size - 1), "avg_degree", self.avg_degree,
                 f"avg_degree * intra_fraction = {intra_degree:g} <= (community_size - 1) / 4 = "
                 f"{0.25 * (self.community_size - 1):g} so communities stay sparse",
                 "raise community_size or lower avg_degree or intra_fraction")
        _require(self.avg_degree <= 0.25 * (self.num_nodes - 1), "avg_degree", self.avg_degree,
                 f"<= (num_nodes - 1) / 4 = {0.25 * (self.num_nodes - 1):g} so the graph stays sparse",
                 "raise num_nodes or lower avg_degree")
        _require(_is_real(self.degree_exponent) and self.degree_exponent > 1, "degree_exponent",
                 self.degree_exponent, "> 1 (real graphs: 2 to 3)", "use e.g. 2.5")
        _require(_is_real(self.max_degree) and self.max_degree >= self.avg_degree, "max_degree", self.max_degree,
                 f">= avg_degree = {self.avg_degree}", "raise max_degree")
        _require(_is_real(self.feature_noise) and self.feature_noise >= 0, "feature_noise", self.feature_noise,
                 ">= 0", "use e.g. 0.7")
        num_alone = 2 * self.num_classes - self.num_communities  # classes with a single community
        if self.same_label_fraction > 0 and self.intra_fraction < 1 and num_alone > 0:
            warnings.warn(f"SyntheticConfig.same_label_fraction={self.same_label_fraction} has no effect on {num_alone} "
                          f"of the {self.num_classes} classes: they have a single community ({self.num_communities} in "
                          f"all), so there is no other same-label community to link to, and those edges stay inside "
                          f"the community; lower community_size to get several per class", stacklevel=3)

    @property
    def num_communities(self) -> int:
        """Number of planted communities, ``max(1, round(num_nodes / community_size))``."""
        return max(1, round(self.num_nodes / self.community_size))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _require(ok: bool, name: str, value: object, expected: str, fix: str) -> None:
    if not ok:
        raise ValueError(f"SyntheticConfig.{name}={value!r} is invalid: expected {expected}; {fix}")


@dataclass(kw_only=True)
class _Layout:
    """Nodes laid out label-major, then community-major: a label's and a community's
    nodes are each a contiguous range of *positions*; ``order`` maps positions to node ids."""

    order: np.ndarray
    """int32 [N]: node id at each position (a random permutation)."""
    cum_weight: np.ndarray
    """float64 [N + 1]: cumulative ``theta`` over positions, starting at 0."""
    community_start: np.ndarray
    """int64 [C + 1]: first position of each community."""
    label_start: np.ndarray
    """int64 [K + 1]: first position of each label's block of communities."""
    community: np.ndarray
    """int32 [N]: community of each node id."""
    labels: np.ndarray
    """int64 [N]: label of each node id."""


def _plant(config: SyntheticConfig, rng: np.random.Generator) -> _Layout:
    """Assign communities, labels and degree weights (see :class:`_Layout`)."""
    n, c, k = config.num_nodes, config.num_communities, config.num_classes
    pos_community = np.arange(n, dtype=np.int64) * c // n  # community c: positions [ceil(c*n/C), ceil((c+1)*n/C))
    community_start = (np.arange(c + 1, dtype=np.int64) * n + c - 1) // c
    community_label = np.arange(c, dtype=np.int64) * k // c
    label_start = community_start[(np.arange(k + 1, dtype=np.int64) * c + k - 1) // k]

    order = rng.permutation(n).astype(np.int32)
    community = np.empty(n, dtype=np.int32)
    community[order] = pos_community
    del pos_community
    labels = community_label[community]

    # Pareto weights theta >= 1 with tail P(theta > t) = t**-(g-1): degrees follow k**-g.
    # An exponent near 1 overflows; such hubs are capped below anyway.
    with np.errstate(over="ignore"):
        theta = (1.0 - rng.random(n)) ** (-1.0 / (config.degree_exponent - 1.0))
    np.minimum(theta, 1e15, out=theta)
    # Scale to mean 1 (expected degree avg_degree * theta), then cap; repeated as capping lowers the mean.
    cap = config.max_degree / config.avg_degree
    for _ in range(100):
        theta /= theta.mean()
        np.minimum(theta, cap, out=theta)
        if theta.mean() > 0.999:
            break
    cum_weight = np.zeros(n + 1, dtype=np.float64)
    np.cumsum(theta, out=cum_weight[1:])
    return _Layout(order=order, cum_weight=cum_weight, community_start=community_start, label_start=label_start,
                   community=community, labels=labels)


def _draw_first_endpoints(cum: np.ndarray, start: int, stop: int, rate: float,
                          seed: np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First endpoints at positions ``[start, stop)``: int64 [m] positions, float64 [m] kind uniforms,
    float64 [m] second-endpoint uniforms.

    Position ``p`` starts ``Poisson(rate * theta[p])`` pairs: the same law as drawing the first
    endpoint in proportion to ``theta``, but the endpoints come out sorted, so no search is needed
    and the intra-community searches that follow stay within a cache-sized window of ``cum``.
    """
    rng = np.random.default_rng(seed)
    counts = rng.poisson(np.diff(cum[start:stop + 1]) * rate)
    first = np.repeat(np.arange(start, stop, dtype=np.int64), counts)
    return first, rng.random(first.size), rng.random(first.size)


def _kind_tables(config: SyntheticConfig, layout: _Layout) -> tuple[np.ndarray, np.ndarray]:
    """Where the second endpoint of a pair of each kind may fall, per community.

    Row ``kind * C + c`` describes a pair whose first endpoint lies in community ``c``; kind 0 is
    intra-community, 1 another community of the same label, 2 anywhere.  Returns float64 [3C, 4]:
    weight range start, weight span, and for kind 1 the weight at which the own community begins
    and its weight (to skip over it); and int64 [3C, 2]: first and last allowed position.
    """
    n, c, k = config.num_nodes, config.num_communities, config.num_classes
    cum, cstart, lstart = layout.cum_weight, layout.community_start, layout.label_start
    label = np.arange(c) * k // c
    c_lo, c_w = cum[cstart[:-1]], cum[cstart[1:]] - cum[cstart[:-1]]
    l_lo, l_w = cum[lstart[label]], cum[lstart[label + 1]] - cum[lstart[label]]
    # A label with one community has no other one: its same-label pairs stay inside.
    alone = l_w - c_w <= 0
    weights = np.empty((3, c, 4))
    weights[0] = np.stack([c_lo, c_w, np.full(c, np.inf), np.zeros(c)], axis=1)
    weights[1] = np.where(alone[:, None], weights[0], np.stack([l_lo, l_w - c_w, c_lo, c_w], axis=1))
    weights[2] = [0.0, cum[-1], np.inf, 0.0]
    bounds = np.empty((3, c, 2), dtype=np.int64)
    bounds[0] = np.stack([cstart[:-1], cstart[1:] - 1], axis=1)
    bounds[1] = np.where(alone[:, None], bounds[0], np.stack([lstart[label], lstart[label + 1] - 1], axis=1))
    bounds[2] = [0, n - 1]
    return weights.reshape(3 * c, 4), bounds.reshape(3 * c, 2)


def _pair_keys(config: SyntheticConfig, layout: _Layout, tables: tuple[np.ndarray, np.ndarray],
               first: np.ndarray, r_kind: np.ndarray, r_second: np.ndarray) -> np.ndarray:
    """Draw the second endpoint of each pair; int64 [<= m] keys ``lo * N + hi`` with ``lo < hi``
    (self-loops dropped, repeats kept).  ``first``: int64 [m] position of each pair's first endpoint;
    ``r_kind``, ``r_second``: float64 [m] uniforms choosing the kind and the second endpoint;
    ``tables``: from :func:`_kind_tables`."""
    n, c = config.num_nodes, config.num_communities
    weights, bounds = tables
    p_intra = config.intra_fraction
    p_same = p_intra + (1.0 - p_intra) * config.same_label_fraction
    row = first * c // n  # community of the first endpoint
    is_intra = r_kind < p_intra
    row += (~is_intra).astype(np.int64) * c
    row += (r_kind >= p_same).astype(np.int64) * c
    w_lo, w_span, skip_at, skip_w = weights[row].T
    w = w_lo + r_second * w_span
    # Same-label pairs skip over the own community's weight, so they land outside it.
    w += np.where(w >= skip_at, skip_w, 0.0)
    del w_lo, w_span, skip_at, skip_w
    second = _search_positions(layout.cum_weight, w, local=is_intra)
    del w, is_intra
    # Rounding at a range edge could step one position out; pull it back inside.
    pos_lo, pos_hi = bounds[row].T
    np.clip(second, pos_lo, pos_hi, out=second)
    del row, pos_lo, pos_hi

    u = layout.order[first].astype(np.int64)
    v = layout.order[second].astype(np.int64)
    del second
    keep = u != v
    lo_node = np.minimum(u[keep], v[keep])
    hi_node = np.maximum(u[keep], v[keep])
    return lo_node * n + hi_node


def _search_positions(cum: np.ndarray, w: np.ndarray, local: np.ndarray) -> np.ndarray:
    """int64 [m]: the position ``p`` with ``cum[p] <= w < cum[p + 1]`` for each weight ``w``.

    Intra-community queries (``local``) come in order of community and hit a small
    window of ``cum``.  The others would each cost a chain of cache misses in a binary
    search over the whole array, so they are searched in sorted order and put back.
    """
    found = np.empty(w.size, dtype=np.int64)
    found[local] = np.searchsorted(cum, w[local], side="right")
    far = np.flatnonzero(~local)
    far = far[np.argsort(w[far])]
    found[far] = np.searchsorted(cum, w[far], side="right")
    found -= 1
    return found


def _sample_unique_pairs(config: SyntheticConfig, layout: _Layout, root: np.random.SeedSequence,
                         log: _Log) -> np.ndarray:
    """int64 [M]: sorted unique undirected pair keys, M close to ``num_nodes * avg_degree / 2``.
    Self-loops and repeats are dropped, then the shortfall is drawn again (a few rounds)."""
    n = config.num_nodes
    target = round(n * config.avg_degree / 2)
    num_blocks = -(-n // _BLOCK)
    tables = _kind_tables(config, layout)
    unique = np.empty(0, dtype=np.int64)
    to_draw, drawn = target, 0
    for round_ in range(_MAX_TOP_UP_ROUNDS + 1):
        rate = to_draw / layout.cum_weight[-1]
        # Enough position blocks per chunk for about chunk_edges pairs.
        blocks_per_chunk = max(1, int(config.chunk_edges * n / (to_draw * _BLOCK)))
        seeds = root.spawn(num_blocks)  # spawn() continues the sequence: top-ups get fresh seeds
        parts = []
        for b0 in range(0, num_blocks, blocks_per_chunk):
            draws = [_draw_first_endpoints(layout.cum_weight, b * _BLOCK, min((b + 1) * _BLOCK, n), rate, seeds[b])
                     for b in range(b0, min(b0 + blocks_per_chunk, num_blocks))]
            first, r_kind, r_second = (np.concatenate(arrays) for arrays in zip(*draws))
            del draws
            drawn += first.size
            parts.append(_pair_keys(config, layout, tables, first, r_kind, r_second))
            del first, r_kind, r_second
            log(f"round {round_}: sampled {drawn:,} pairs")
        fresh = np.unique(np.concatenate(parts))
        del parts
        unique = _merge_unique(unique, fresh)
        del fresh
        missing = target - unique.size
        log(f"round {round_}: {unique.size:,} unique pairs, {missing:,} short of {target:,}")
        if missing <= _DEGREE_TOLERANCE * target:
            break
        # Later draws repeat existing pairs at least as often as earlier ones did.
        yield_rate = max(unique.size / drawn, 0.05)
        to_draw = min(math.ceil(missing / yield_rate), target)
    if missing > 0.01 * target:
        warnings.warn(f"synthetic graph has average degree {2 * unique.size / n:.3g}, short of the requested "
                      f"avg_degree={config.avg_degree}: too many sampled pairs repeat; raise community_size or "
                      f"lower max_degree", stacklevel=3)
    return unique


def _merge_unique(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted union of two sorted unique int64 arrays; linear in ``a`` (no re-sort of it)."""
    if a.size == 0:
        return b
    at = np.searchsorted(a, b)
    known = a[np.minimum(at, a.size - 1)] == b
    return np.insert(a, at[~known], b[~known])


def _csc_from_pairs(pairs: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """CSC ``(indptr int64 [N+1], indices int64 [2M])`` of the undirected pairs ``lo * N + hi``
    (int64 [M], unique, ``lo < hi``), both directions stored.  Peak is about ``pairs`` + 3M int64
    entries; ``csc_from_edges`` would hold several full-size src/dst/key copies at once."""
    m, n = pairs.size, np.int64(num_nodes)
    keys = np.empty(2 * m, dtype=np.int64)  # dst * N + src
    keys[:m] = pairs  # dst = lo, src = hi
    step = 1 << 22
    for s in range(0, m, step):  # the reverse direction, in slices to bound temporaries
        lo, hi = np.divmod(pairs[s:s + step], n)
        keys[m + s:m + s + lo.size] = hi * n + lo
    del pairs
    # With both halves sorted, timsort only merges two runs: half a full sort's time, <= M entries extra.
    keys[m:].sort()
    keys.sort(kind="stable")
    indptr = np.searchsorted(keys, np.arange(num_nodes + 1, dtype=np.int64) * n)
    np.remainder(keys, n, out=keys)
    return indptr.astype(np.int64, copy=False), keys


def _centroids(config: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    """float32 [K, F] unit-norm class centroids, orthonormal when ``F >= K``."""
    k, f = config.num_classes, config.feat_dim
    g = rng.standard_normal((f, k))
    if f >= k:
        q, r = np.linalg.qr(g)
        centroids = (q * np.sign(np.diag(r))).T  # sign fix makes QR's output unique
    else:
        centroids = g.T / np.linalg.norm(g.T, axis=1, keepdims=True)
    return np.ascontiguousarray(centroids, dtype=np.float32)


def _features(config: SyntheticConfig, labels: np.ndarray, root: np.random.SeedSequence) -> np.ndarray:
    """float32 [N, F]: class centroid plus Gaussian noise, filled block by block."""
    features = np.empty((config.num_nodes, config.feat_dim), dtype=np.float32)
    for _ in fill_features(config, labels, root, features):
        pass
    return features


def fill_features(config: SyntheticConfig, labels: np.ndarray, root: np.random.SeedSequence,
                  out: np.ndarray) -> Iterator[int]:
    """Fill ``out`` (float32 [N, F], e.g. a writable memory map) block by block with the centroid-plus-noise
    features; yields the end row of each block once it is written, so a caller can hand its pages back."""
    n = config.num_nodes
    centroids = _centroids(config, np.random.default_rng(root.spawn(1)[0]))
    noise = np.float32(config.feature_noise)
    for seed, s in zip(root.spawn(-(-n // _BLOCK)), range(0, n, _BLOCK)):
        rows = out[s:s + _BLOCK]
        np.random.default_rng(seed).standard_normal(out=rows, dtype=np.float32)
        rows *= noise
        rows += centroids[labels[s:s + _BLOCK]]
        yield s + rows.shape[0]


def _split_masks(config: SyntheticConfig, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Three bool [1, N] masks: disjoint random train/val/test sets of the configured sizes."""
    n = config.num_nodes
    n_train = max(1, round(config.train_fraction * n))
    n_val = min(round(config.val_fraction * n), n - n_train)
    n_test = min(round(config.test_fraction * n), n - n_train - n_val)
    # Position i of a seeded permutation goes to the split whose range of positions holds i (if any).
    split = np.empty(n, dtype=np.int64)
    split[rng.permutation(n)] = np.searchsorted(np.cumsum([n_train, n_val, n_test]), np.arange(n), side="right")
    return tuple((split == k)[None, :] for k in range(3))


class _Log:
    """Stage timings on stderr when enabled; a library never prints uninvited."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.start = enabled, time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[synthetic {time.perf_counter() - self.start:7.1f}s] {message}", file=sys.stderr, flush=True)


def generate_synthetic(config: SyntheticConfig, progress: bool = False) -> GraphDataset:
    """Generate a planted-community graph (see the module docstring); equal configs give identical
    datasets, and ``progress`` prints stage timings to stderr.

    Returns a :class:`GraphDataset` named ``"synthetic"`` with metric ``"accuracy"``, one split, and
    in ``extra``: ``"community"`` (int32 [N], the planted community of each node, for checking
    partition quality), ``"num_communities"`` and ``"config"``.
    """
    log = _Log(progress)
    structure_seq, edge_seq, feature_seq, split_seq = np.random.SeedSequence(config.seed).spawn(4)
    layout = _plant(config, np.random.default_rng(structure_seq))
    log(f"planted {config.num_communities:,} communities over {config.num_nodes:,} nodes")
    # No name holds the pairs here, so _csc_from_pairs can free them before it sorts.
    indptr, indices = _csc_from_pairs(_sample_unique_pairs(config, layout, edge_seq, log), config.num_nodes)
    log(f"built CSC with {indices.size:,} directed edges")
    features = _features(config, layout.labels, feature_seq)
    log(f"generated features {features.shape}")
    train, val, test = _split_masks(config, np.random.default_rng(split_seq))
    dataset = GraphDataset(name="synthetic", indptr=indptr, indices=indices, features=features, labels=layout.labels,
                           train_masks=train, val_masks=val, test_masks=test, num_classes=config.num_classes,
                           metric="accuracy", source=f"synthetic(seed={config.seed})",
                           extra={"community": layout.community, "num_communities": config.num_communities,
                                  "config": asdict(config)})
    log("done")
    return dataset
