"""Offline graph partitioning for distributed training, and the partition folder it writes.

::

    python -m partition --dataset cora --data-dir ../shared/datasets/cora --num-parts 4 --out parts/cora4
    python -m partition verify parts/cora4 --dataset cora --data-dir ../shared/datasets/cora

    from partition import load_partition
    part = load_partition("parts/cora4", rank)          # only partition `rank`, memory-mapped

Pipeline (one line of progress per stage): **load** the dataset; **metis**: multi-constraint
k-way METIS on the symmetrised graph (one vertex-weight column per ``--balance`` constraint,
then :mod:`partition.rebalance` where METIS misses its 1.03 tolerance) or a seeded random
assignment; **relabel**: partition ``p`` gets the contiguous new global
ids ``[start_p, end_p)``, nodes keeping their original relative order; **write** each
partition's arrays, streamed in chunks and hashed while written; **checksum**: finish the
hashes and write the manifest.  The folder is written as ``OUT.tmp-<pid>`` and renamed to
``OUT`` at the end, so it is complete or absent; ``--force`` replaces an existing one only
after the new one is complete.

The folder (format version 1)::

    OUT/
    |-- manifest.json        format name + version; num_nodes, num_edges, num_parts,
    |                        node_ranges [[start_p, end_p), ...] tiling [0, N) in order;
    |                        num_classes, metric, num_splits, halo_hops;
    |                        node_data {name: dtype, global shape}; partitioning (method,
    |                        balance constraints, seed, METIS options); quality (edge cut,
    |                        balance max/mean per constraint, halo sizes, replication
    |                        factor); stages (seconds and peak RSS of each); parts (per
    |                        partition counts); files {path: bytes, sha256, dtype, shape};
    |                        command; created; gnnscale_version
    |-- orig2new.npy         int64 [N]       new global id of every original node id
    |-- part0/
    |   |-- indptr.npy       int64 [n_0 + 1] CSC offsets over owned local destination ids
    |   |-- indices.npy      int64 [E_0]     source of each in-edge of an owned node, NEW GLOBAL id
    |   |-- halo_ids.npy     int64 [h_0]     sorted new global ids of non-owned nodes within
    |   |                                    halo_hops in-hops of owned nodes
    |   |-- orig_ids.npy     int64 [n_0]     original id of each owned node (local order)
    |   |-- features.npy     float32 [n_0, F]
    |   |-- labels.npy       int64 [n_0]
    |   |-- train_masks.npy  bool [S, n_0]   every split of the source dataset
    |   |-- val_masks.npy    bool [S, n_0]
    |   `-- test_masks.npy   bool [S, n_0]
    |-- part1/ ...
    `-- part{K-1}/ ...

Partition ``p`` owns new global ids ``[start_p, end_p)``; its local id ``i`` is global id
``start_p + i``.  Every edge of the source graph is stored exactly once, as an in-edge of
its destination, in the partition that owns the destination; within a destination the
sources keep the source dataset's order.  Every file is a plain ``.npy`` that opens with
``np.load(path, mmap_mode="r", allow_pickle=False)``.

Public API:

* :func:`partition_graph` (:class:`PartitionConfig`) -- write a folder from a ``GraphDataset``.
* :func:`load_partition` -> :class:`Partition` -- one partition's arrays and the book.
* :class:`PartitionBook` -- new global id <-> (partition, local id) <-> original id, vectorised.
* :func:`verify` -- check a folder (and compare it with its dataset); :class:`PartitionError`.
"""

from partition.book import PartitionBook
from partition.config import PartitionConfig
from partition.format import FORMAT_VERSION, PartitionError
from partition.load import Partition, load_partition
from partition.partitioner import partition_graph
from partition.verify import verify

__all__ = ["FORMAT_VERSION", "Partition", "PartitionBook", "PartitionConfig", "PartitionError", "load_partition",
           "partition_graph", "verify"]
