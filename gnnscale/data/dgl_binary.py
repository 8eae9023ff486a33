"""Graphs saved with ``dgl.save_graphs``.

The graph's ``ndata`` must hold ``feat`` float [N, F], ``label`` int [N] (or [N, 1]) and
``train_mask``, ``val_mask``, ``test_mask`` bool [N], or [N, S] for S splits (DGL's
column-per-split habit, e.g. its heterophilous datasets).  ``save_graphs`` stores bool tensors
as uint8, so masks are compared with zero rather than trusted to be bool.  Edges are taken as
stored (DGL's citation datasets already hold both directions); pass ``symmetrize=True`` for a
graph that stores each undirected edge once.  ``dgl`` is the optional ``[dgl]`` extra, imported
inside the loader: it is slow to import, and its newest build imports only with torch <= 2.2.1.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from gnnscale.data.dataset import DatasetError, GraphDataset, check_features, check_labels, fail
from gnnscale.data.loaders import edges_to_csc, require_file

_NDATA_KEYS = ("feat", "label", "train_mask", "val_mask", "test_mask")
_INSTALL_FIX = ("install the extra, on Python 3.11: pip install 'gnnscale[dgl]' 'torch==2.2.1' 'numpy<2' "
                "(dgl 2.1.0 imports only with torch<=2.2.1; scripts/dev.sh test-dgl installs exactly that in "
                ".venv-dgl)")
_SAVE_FIX = ("write the graph with dgl.save_graphs(path, [g]) after setting g.ndata['feat'], 'label', "
             "'train_mask', 'val_mask' and 'test_mask'")


def load_dgl_binary(data_dir: str | Path, *, graph_index: int = 0, symmetrize: bool = False,
                    name: str | None = None) -> GraphDataset:
    """Load one graph from a ``dgl.save_graphs`` file.

    Args:
        data_dir: the ``.bin`` file, or a folder holding exactly one ``.bin`` file.
        graph_index: which graph of the file to load.
        symmetrize: add every reverse edge.
        name: dataset name for logs; defaults to the file's stem.

    Returns:
        A :class:`GraphDataset` with self loops and duplicate edges removed,
        ``num_classes`` = max label + 1, and one split per mask column.
    """
    path = _resolve_file(Path(data_dir))
    source = str(path)
    dgl = _import_dgl(source)

    try:
        graphs, _ = dgl.load_graphs(source)
    except Exception as err:  # DGL raises DGLError/RuntimeError for foreign or truncated files
        raise fail(source, "graph", f"cannot be read by dgl.load_graphs ({type(err).__name__}: {err})",
                   _SAVE_FIX) from None
    if not 0 <= graph_index < len(graphs):
        raise fail(source, "graph_index", f"{graph_index} is out of range: the file holds {len(graphs)} graph(s)",
                   f"pass graph_index between 0 and {len(graphs) - 1}")
    graph = graphs[graph_index]
    if not graph.is_homogeneous:
        raise fail(source, "graph", f"is heterogeneous (node types {graph.ntypes})",
                   "convert it with dgl.to_homogeneous, or save one node type")
    missing = [key for key in _NDATA_KEYS if key not in graph.ndata]
    if missing:
        raise fail(source, f"ndata[{missing[0]!r}]", f"missing (graph has {sorted(graph.ndata.keys())})",
                   _SAVE_FIX)
    num_nodes = int(graph.num_nodes())
    ndata = {key: graph.ndata[key].numpy() for key in _NDATA_KEYS}
    features = check_features(ndata["feat"], num_nodes, source)
    labels, num_classes = check_labels(ndata["label"], num_nodes, source)
    masks = {key: _split_masks(ndata[key], key, num_nodes, source) for key in ("train_mask", "val_mask", "test_mask")}

    src, dst = (t.numpy() for t in graph.edges())
    indptr, indices = edges_to_csc(src, dst, num_nodes, source, symmetrize=symmetrize)
    return GraphDataset(
        name=name or path.stem, indptr=indptr, indices=indices, features=features, labels=labels,
        train_masks=masks["train_mask"], val_masks=masks["val_mask"], test_masks=masks["test_mask"],
        num_classes=num_classes, metric="accuracy", source=source,
    )


class DGLUnavailableError(DatasetError, ImportError):
    """``dgl`` cannot be imported: a one-line :class:`DatasetError` (the CLIs print it and exit 2)."""


def _import_dgl(source: str) -> ModuleType:
    try:
        import dgl  # noqa: PLC0415 - see the module docstring
    except Exception as err:  # a too-new torch makes `import dgl` fail with OSError/FileNotFoundError too
        first_line = next(iter(str(err).strip().splitlines()), "")
        raise DGLUnavailableError(f"{source}: dgl: reading dgl.save_graphs files needs dgl, which cannot be "
                                  f"imported ({type(err).__name__}: {first_line}); {_INSTALL_FIX}") from None
    return dgl


def _resolve_file(path: Path) -> Path:
    if path.is_dir():
        candidates = sorted(path.glob("*.bin"))
        if len(candidates) != 1:
            found = ", ".join(p.name for p in candidates) or "none"
            raise fail(str(path), "data_dir", f"expected exactly one .bin file in the folder, found {found}",
                       "pass the path of the graph file itself")
        return candidates[0]
    return require_file(path, "graph", _SAVE_FIX)


def _split_masks(mask: np.ndarray, key: str, num_nodes: int, source: str) -> np.ndarray:
    """bool [S, N] from a [N] or [N, S] mask of any 0/1 dtype."""
    if mask.ndim == 1:
        mask = mask[:, None]
    if mask.ndim != 2 or mask.shape[0] != num_nodes:
        raise fail(source, f"ndata[{key!r}]", f"expected shape [{num_nodes}] or [{num_nodes}, num_splits], "
                   f"got {list(mask.shape)}", "store one 0/1 entry per node (and per split)")
    if mask.dtype != np.bool_ and not np.isin(mask, (0, 1)).all():
        raise fail(source, f"ndata[{key!r}]", "holds values other than 0 and 1", "store boolean masks")
    return np.ascontiguousarray((mask != 0).T)
