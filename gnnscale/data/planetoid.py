"""Planetoid citation graphs (Cora, CiteSeer, PubMed) with the standard Kipf split.

Files (from kimiyoung/planetoid ``data/``), all in one folder::

    ind.<name>.x           csr_matrix [num_train, F]   features of the training nodes
    ind.<name>.y           ndarray    [num_train, C]   their one-hot labels
    ind.<name>.allx        csr_matrix [num_labeled, F] features of every non-test node
    ind.<name>.ally        ndarray    [num_labeled, C]
    ind.<name>.tx          csr_matrix [num_test, F]    row i belongs to node test.index[i]
    ind.<name>.ty          ndarray    [num_test, C]
    ind.<name>.graph       defaultdict(list)            node -> neighbour list
    ind.<name>.test.index  text, one node id a line    not contiguous, not sorted

All but ``test.index`` are Python 2 pickles.  Unpickling runs whatever callables a
file names, so they are read with :class:`ArrayUnpickler`, which admits only the
handful of numpy/scipy/collections globals these files actually use (found with
``pickletools``): a file naming anything else is refused before it can run.

Split (Kipf & Welling 2017; PyG's ``Planetoid(split="public")``): train = the first ``len(y)`` nodes (140
Cora, 120 CiteSeer), val = the next 500, test = the 1,000 nodes of ``test.index``.

CiteSeer: ``test.index`` spans 2312..3326 but names only 1,000 of those 1,015 ids;
the 15 others are isolated nodes that appear in no file.  As Kipf and PyG do, they
get all-zero feature rows and the label 0 (PyG takes ``argmax`` of their all-zero
one-hot rows); they are in no mask, so the label is never trained or scored.
"""

from __future__ import annotations

import collections
import io
import itertools
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

try:  # numpy >= 1.26 has numpy._core; numpy 2 deprecates the numpy.core path the files name
    from numpy._core.multiarray import _reconstruct
except ImportError:
    from numpy.core.multiarray import _reconstruct

from gnnscale.data.dataset import DatasetError, GraphDataset, fail
from gnnscale.data.loaders import edges_to_csc, require_dir, require_file

_DOWNLOAD_FIX = ("download ind.{name}.{{x,y,tx,ty,allx,ally,graph,test.index}} from "
                 "https://github.com/kimiyoung/planetoid/tree/master/data into {folder}")

_NUM_VAL = 500

# Pickled part -> (expected type, what it should be, for the error message).
_PARTS: dict[str, tuple[type | tuple[type, ...], str]] = {
    **{part: ((sp.spmatrix, np.ndarray), "a feature matrix") for part in ("x", "tx", "allx")},
    **{part: (np.ndarray, "a one-hot label array") for part in ("y", "ty", "ally")},
    "graph": (dict, "a dict of adjacency lists"),
}


# Exactly the globals ``pickletools.genops`` finds in the Cora/CiteSeer files.  ``__builtin__`` is
# the Python 2 spelling the files use; scipy.sparse.csr is a deprecated module path, so the class
# is handed over directly rather than imported from there.  With these, REDUCE/NEWOBJ/BUILD can
# only build arrays, dtypes, sparse matrices and lists.
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("scipy.sparse.csr", "csr_matrix"): sp.csr_matrix,
    ("collections", "defaultdict"): collections.defaultdict,
    ("__builtin__", "list"): list,
    ("builtins", "list"): list,
}


class ArrayUnpickler(pickle.Unpickler):
    """An unpickler that builds only numpy arrays, scipy CSR matrices and ``defaultdict(list)``.

    Any other global (``os.system``, ``builtins.eval``, ...) raises a
    :class:`DatasetError` naming the file, before the callable is ever looked up.
    """

    def __init__(self, file: io.BufferedIOBase, source: str) -> None:
        super().__init__(file, encoding="latin1")
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise fail(self._source, "pickle",
                       f"holds a non-array object (global {module}.{name}); refusing to unpickle it",
                       "use the original Planetoid files, which contain only numpy/scipy arrays") from None


def read_array_pickle(path: Path) -> Any:
    """Unpickle ``path`` with :class:`ArrayUnpickler`; every failure is a :class:`DatasetError`."""
    with open(path, "rb") as handle:
        try:
            return ArrayUnpickler(handle, str(path)).load()
        except DatasetError:
            raise
        except Exception as err:  # a truncated or foreign file fails in many ways
            raise fail(str(path), "pickle", f"cannot be read ({type(err).__name__}: {err})",
                       "re-download the file") from None


def load_planetoid(data_dir: str | Path, *, name: str, row_normalize: bool = True) -> GraphDataset:
    """Load Planetoid ``name`` (``"cora"``, ``"citeseer"`` or ``"pubmed"``) with its public split.

    Args:
        data_dir: folder holding ``ind.<name>.*``.
        name: dataset name, the infix of the file names.
        row_normalize: divide each feature row by its sum (Kipf's ``preprocess_features``,
            PyG's ``NormalizeFeatures``); all-zero rows stay zero.

    Returns:
        A one-split :class:`GraphDataset`: symmetric graph without self loops or
        duplicates; features float32 [N, F]; labels int64 [N].
    """
    folder = Path(data_dir)
    fix = _DOWNLOAD_FIX.format(name=name, folder=folder)
    require_dir(folder, "data_dir", fix)
    paths = {part: require_file(folder / f"ind.{name}.{part}", part, fix)
             for part in ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")}
    parts = {part: _read_part(paths[part], kind, what) for part, (kind, what) in _PARTS.items()}
    test_index = _read_test_index(paths["test.index"])
    _check_parts_agree(parts, test_index, paths)

    num_train = parts["y"].shape[0]
    num_labeled = parts["allx"].shape[0]
    # Ids run 0..max(test.index); test-range ids not in it are CiteSeer's isolated nodes (module docstring).
    num_nodes = max(num_labeled, int(test_index.max()) + 1)
    features, one_hot = _scatter_rows(parts, test_index, num_nodes, row_normalize)
    labels = one_hot.argmax(axis=1)  # all-zero rows -> 0, as in PyG

    src, dst = _graph_edges(parts["graph"], str(paths["graph"]))
    indptr, indices = edges_to_csc(src, dst, num_nodes, str(paths["graph"]), symmetrize=True)

    ids = np.arange(num_nodes)
    train, val = ids < num_train, (ids >= num_train) & (ids < num_train + _NUM_VAL)
    test = np.zeros(num_nodes, dtype=bool)
    test[test_index] = True
    return GraphDataset(
        name=name, indptr=indptr, indices=indices, features=features, labels=labels,
        train_masks=train, val_masks=val, test_masks=test, num_classes=int(one_hot.shape[1]),
        metric="accuracy", source=str(folder),
        extra={"num_unlisted_test_range_nodes": int(num_nodes - num_labeled - test_index.shape[0])},
    )


def _check_parts_agree(parts: dict[str, Any], test_index: np.ndarray, paths: dict[str, Path]) -> None:
    """Raise a :class:`DatasetError` unless the rows and columns of the eight files fit together."""
    for a, b in (("x", "y"), ("allx", "ally"), ("tx", "ty")):
        if parts[a].shape[0] != parts[b].shape[0]:
            raise fail(str(paths[b]), b, f"{parts[b].shape[0]} label rows for {parts[a].shape[0]} rows of {a}",
                       "the files do not belong together; re-download all of them")
    for a, b in (("allx", "tx"), ("ally", "ty")):
        if parts[a].shape[1] != parts[b].shape[1]:
            raise fail(str(paths[b]), b, f"{parts[b].shape[1]} columns, but {a} has {parts[a].shape[1]}",
                       "the files do not belong together; re-download all of them")
    num_labeled = parts["allx"].shape[0]
    num_test = parts["tx"].shape[0]
    if test_index.shape[0] != num_test or parts["ty"].shape[0] != num_test:
        raise fail(str(paths["test.index"]), "test.index",
                   f"{test_index.shape[0]} ids for {num_test} rows of tx and {parts['ty'].shape[0]} rows of ty",
                   "the files do not belong together; re-download all of them")
    if test_index.min() < num_labeled or np.unique(test_index).shape[0] != num_test:
        raise fail(str(paths["test.index"]), "test.index",
                   f"ids must be distinct and >= {num_labeled} (the rows of allx)", "re-download the file")


def _scatter_rows(parts: dict[str, Any], test_index: np.ndarray, num_nodes: int,
                  row_normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Features float32 [N, F] and one-hot labels float32 [N, C], rows placed at their node ids."""
    num_labeled = parts["allx"].shape[0]
    features = np.zeros((num_nodes, parts["allx"].shape[1]), dtype=np.float32)
    features[:num_labeled] = _dense(parts["allx"])
    features[test_index] = _dense(parts["tx"])
    one_hot = np.zeros((num_nodes, parts["ally"].shape[1]), dtype=np.float32)
    one_hot[:num_labeled] = parts["ally"]
    one_hot[test_index] = parts["ty"]
    if row_normalize:
        row_sum = features.sum(axis=1, keepdims=True)
        np.divide(features, row_sum, out=features, where=row_sum != 0)
    return features, one_hot


def _read_part(path: Path, kind: type | tuple[type, ...], what: str) -> Any:
    obj = read_array_pickle(path)
    if not isinstance(obj, kind):
        raise fail(str(path), "pickle", f"holds a {type(obj).__name__}, expected {what}", "re-download the file")
    return obj


def _dense(matrix: sp.spmatrix | np.ndarray) -> np.ndarray:
    return np.asarray(matrix.todense() if sp.issparse(matrix) else matrix, dtype=np.float32)


def _read_test_index(path: Path) -> np.ndarray:
    """int64 [num_test]: the node id of each row of ``tx``/``ty``, in file order."""
    try:
        ids = np.loadtxt(path, dtype=np.int64, ndmin=1)
    except ValueError as err:
        raise fail(str(path), "test.index", f"expected one integer node id per line ({err})",
                   "re-download the file") from None
    if ids.size == 0:
        raise fail(str(path), "test.index", "is empty", "re-download the file")
    return ids


def _graph_edges(graph: dict, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Flatten ``{node: [neighbours]}`` into int64 COO ``(src, dst)`` without a per-edge Python loop."""
    try:
        keys = np.fromiter(graph.keys(), dtype=np.int64, count=len(graph))
        counts = np.fromiter(map(len, graph.values()), dtype=np.int64, count=len(graph))
        neighbours = np.fromiter(itertools.chain.from_iterable(graph.values()), dtype=np.int64,
                                 count=int(counts.sum()))
    except (TypeError, ValueError) as err:
        raise fail(source, "graph", f"expected integer node ids mapped to lists of integer ids ({err})",
                   "re-download the file") from None
    return np.repeat(keys, counts), neighbours
