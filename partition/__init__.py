"""Offline graph partitioning for distributed training, and the partition folder it writes.

::

    python -m partition --dataset cora --data-dir ../shared/datasets/cora --num-parts 4 --out parts/cora4
    python -m partition verify parts/cora4 --dataset cora --data-dir ../shared/datasets/cora

    from partition import load_partition
    part = load_partition("parts/cora4", rank)          # only partition `rank`, memory-mapped

Pipeline (one line of progress per stage): **load** the dataset; **metis**: multi-constraint
k-way METIS on the symmetrised graph (one vertex-weight column per ``--balance`` constraint,
then :mod:`partition.rebalance` where METIS misses its 1.03 tolerance), or **kaminpar**: the same
with KaMinPar (:mod:`partition.kaminpar_parts`, one combined node weight), or a seeded random
assignment; **relabel**: partition ``p`` gets the contiguous new global ids ``[start_p, end_p)``,
nodes keeping their original relative order; **write** each partition's arrays, streamed in
chunks and hashed while written; **checksum**: finish the hashes and write the manifest.  The
folder appears complete or not at all (:func:`partition.writer.atomic_directory`).

The folder's layout (format version 1) and its three id spaces are drawn in docs/partitioning.md, "The
partition folder": a ``manifest.json``, ``orig2new.npy``, and per partition ``part<p>/`` the arrays of
:data:`partition.format.PART_ARRAYS`.  Partition ``p`` owns the new global ids ``[start_p, end_p)``;
every edge is stored once, as an in-edge of its destination, in the partition owning the destination.
Every file is a plain ``.npy`` that opens with ``np.load(path, mmap_mode="r", allow_pickle=False)``.

Public API:

* :func:`partition_graph` (:class:`PartitionConfig`) -- write a folder from a ``GraphDataset``.
* :func:`load_out_of_core` (:class:`OutOfCorePlan`) -- an edge-list folder as a ``GraphDataset`` whose CSC is
  built on disk by an external sort (what ``--out-of-core`` hands :func:`partition_graph`).
* :func:`load_partition` -> :class:`Partition` -- one partition's arrays and the book.
* :class:`PartitionBook` -- new global id <-> (partition, local id) <-> original id, vectorised.
* :func:`verify` -- check a folder (and compare it with its dataset); :class:`PartitionError`.
"""

from partition.book import PartitionBook
from partition.config import PartitionConfig
from partition.external import OutOfCorePlan, load_out_of_core
from partition.format import FORMAT_VERSION, PartitionError
from partition.load import Partition, load_partition
from partition.partitioner import partition_graph
from partition.verify import verify

__all__ = ["FORMAT_VERSION", "OutOfCorePlan", "Partition", "PartitionBook", "PartitionConfig", "PartitionError",
           "load_out_of_core", "load_partition", "partition_graph", "verify"]
