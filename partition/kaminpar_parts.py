"""``--method kaminpar``: k-way partitioning with KaMinPar (the ``kaminpar`` package, an optional extra).

KaMinPar's Python API reads a graph only from a file, so the symmetric CSR that METIS would get is
written once to a temporary ParHIP binary file (header, byte offsets, 32-bit neighbour ids where the
graph has fewer than 2**31 nodes, 64-bit node weights), loaded (``terapart*`` contexts load it
compressed), and the file is removed before partitioning starts.  The file is written in chunks: no
converted copy of the adjacency is held.

KaMinPar balances one node weight.  With ``--balance nodes`` alone the graph is given unweighted;
otherwise every constraint column is scaled to a mean of 100 per node and the columns are summed
(:func:`partition.assign.combined_weights`, what METIS gets under ``--part-weights``), so that the
partition KaMinPar returns is near every constraint's balance, and the rebalance pass that follows
(as for METIS) brings each constraint within its tolerance.  KaMinPar is asked for a third of the
tolerance on that combined weight (0.01 for the default 1.03), so that each constraint usually lands
within the whole tolerance by itself.  A node of weight 0 (``--balance edges``
on an isolated node) is given weight 1.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

from gnnscale.data.pages import release_rows
from partition.config import PartitionConfig

log = logging.getLogger("partition")

INSTALL_HINT = ("install gnnscale[kaminpar] (pip install 'kaminpar==3.7.3'; wheels for Python 3.11-3.13 on "
                "Linux x86_64 and aarch64, macOS arm64)")
_CHUNK = 1 << 22  # adjacency entries converted and written at a time: 16 MiB of int32


def import_kaminpar() -> ModuleType:
    """The ``kaminpar`` module.

    Raises:
        ValueError: it is not installed (one line naming the extra to install).
    """
    try:
        import kaminpar  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise ValueError(f"--method kaminpar needs the kaminpar package, which is not importable ({exc}); "
                         f"{INSTALL_HINT}, or use --method metis") from None
    return kaminpar


def check_context(name: str) -> None:
    """Refuse a KaMinPar context that does not exist, listing those that do (needs the package).

    Raises:
        ValueError: ``name`` is not a KaMinPar context, or kaminpar is not installed.
    """
    names = sorted(import_kaminpar().context_names())
    if name not in names:
        raise ValueError(f"--kaminpar-context {name!r} is not a KaMinPar context; use one of {', '.join(names)} "
                         f"(default: the default; fast: quicker; terapart: least memory, compressed graph)")


def write_parhip(path: Path, xadj: np.ndarray, adjncy: np.ndarray, node_weights: np.ndarray | None) -> None:
    """Write a symmetric CSR as a ParHIP binary graph file (the format KaMinPar and KaHIP read).

    Layout: three uint64 (version flags, n, number of adjacency entries m), n + 1 uint64 byte offsets
    of each node's neighbours in the file, m neighbour ids (uint32 when n < 2**31, else uint64), and
    given ``node_weights``, n int64 weights.  The version's bits say what is *absent or 32-bit*: bit 0
    no edge weights, bit 1 no node weights, bit 2 32-bit offsets, bit 3 32-bit ids, bits 4/5 32-bit
    node/edge weights.

    Args:
        xadj: int [N + 1] offsets; adjncy: int [M] neighbours (either may be memory-mapped).
        node_weights: int64 [N] or None for an unweighted graph.
    """
    num_nodes, num_entries = xadj.shape[0] - 1, adjncy.shape[0]
    narrow = num_nodes < 2**31
    id_dtype = np.uint32 if narrow else np.uint64
    version = 1 | (0 if node_weights is not None else 2) | (8 if narrow else 0)
    base = 8 * 3 + 8 * (num_nodes + 1)
    with open(path, "wb") as file:
        np.asarray([version, num_nodes, num_entries], dtype=np.uint64).tofile(file)
        (np.asarray(xadj, dtype=np.uint64) * np.uint64(np.dtype(id_dtype).itemsize) + np.uint64(base)).tofile(file)
        for lo in range(0, num_entries, _CHUNK):
            np.asarray(adjncy[lo:lo + _CHUNK]).astype(id_dtype).tofile(file)
            release_rows(adjncy, lo, lo + _CHUNK)  # a memory-mapped CSC's pages go back to the page cache
        if node_weights is not None:
            np.asarray(node_weights, dtype=np.int64).tofile(file)


def kaminpar_node_weights(weights: np.ndarray) -> np.ndarray | None:
    """The single node weight KaMinPar balances, int64 [N]: None (unweighted) when the only constraint is one
    unit per node, else the columns of ``weights`` (int64 [N, ncon]) combined at equal totals, at least 1."""
    from partition.assign import combined_weights  # noqa: PLC0415 - assign imports this module lazily

    if weights.shape[1] == 1 and bool(np.all(weights[:, 0] == 1)):
        return None
    return np.maximum(combined_weights(weights), 1)


def kaminpar_parts(xadj: np.ndarray, adjncy: np.ndarray, weights: np.ndarray, config: PartitionConfig,
                   shares: np.ndarray | None, scratch_dir: str | Path | None = None) -> tuple[np.ndarray, dict]:
    """KaMinPar's k-way partition of a symmetric CSR without self loops (seeded, ``config.kaminpar_threads``
    threads, context ``config.kaminpar_context``, imbalance ``ufactor / 1000``, a third of it for a combined
    weight; with ``shares``, each partition's maximum weight is its share of the total times that tolerance).

    Returns:
        ``(parts, info)``: int64 [N], and the options and KaMinPar's own cut (undirected edges) for the manifest.
    """
    kaminpar = import_kaminpar()
    check_context(config.kaminpar_context)
    node_weights = kaminpar_node_weights(weights)
    weighted = node_weights is not None
    compress = config.kaminpar_context.startswith("terapart")
    with tempfile.TemporaryDirectory(prefix="gnnscale-kaminpar-", dir=scratch_dir) as tmp:
        path = Path(tmp) / "graph.parhip"
        write_parhip(path, xadj, adjncy, node_weights)
        graph = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP, compress)
    # Each constraint scatters around the combined weight KaMinPar balances: asked for the whole tolerance it
    # leaves one above it (1M-node benchmark graph: edges 1.034, and the pass then moves 3,041 nodes in 3.4 s);
    # a third of it lands every constraint within 1.012 there, and the folder cuts 12.06% of edges, not 12.13%.
    eps = config.ufactor / 1000 / (3 if weighted else 1)
    total = int(node_weights.sum()) if weighted else xadj.shape[0] - 1
    del node_weights
    kaminpar.reseed(config.seed)
    solver = kaminpar.KaMinPar(config.kaminpar_threads, kaminpar.context_by_name(config.kaminpar_context))
    if shares is None:
        assignment = solver.compute_partition(graph, config.num_parts, eps)
    else:
        limits = [max(1, int(share * total * (1 + eps))) for share in shares]
        assignment = solver.compute_partition(graph, limits)
    cut = int(kaminpar.edge_cut(graph, assignment))
    del graph, solver
    parts = np.fromiter(assignment, dtype=np.int64, count=len(assignment))
    del assignment
    info = {"kaminpar_options": {"context": config.kaminpar_context, "threads": config.kaminpar_threads,
                                 "seed": config.seed, "eps": eps, "compressed": compress,
                                 "node_weights": "combined" if weighted else "unweighted",
                                 "version": getattr(kaminpar, "__version__", "unknown")},
            "kaminpar_cut_undirected_edges": cut}
    return parts, info
