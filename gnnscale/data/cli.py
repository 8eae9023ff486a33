"""The common dataset command-line contract, shared by every gnnscale command (docs/training.md).

``add_dataset_arguments(parser)`` adds ``--dataset``, ``--split`` and the synthetic graph's options
(``--data-dir`` and ``--seed`` as defined once in :mod:`gnnscale.options`), and
``dataset_from_args(args)`` turns them into a :class:`GraphDataset`.  Kept free of heavy imports: a
command that only partitions or verifies never imports torch or dgl unless its dataset format needs it.
"""

from __future__ import annotations

import argparse

from gnnscale.data.dataset import GraphDataset
from gnnscale.options import add_section

DATASETS = ("synthetic", "cora", "citeseer", "tolokers", "dgl", "ogb", "edgelist")
"""The ``--dataset`` choices."""


def add_dataset_arguments(parser: argparse.ArgumentParser, *, default: str | None = "synthetic") -> None:
    """Add the common dataset options to ``parser`` (two argument groups: data, synthetic graph).

    Args:
        default: the ``--dataset`` default; ``None`` for commands where the dataset is optional
            (``args.dataset`` is then ``None`` when the option is not given).
    """
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, default=default, help="which loader to use; all but "
                      "synthetic read --data-dir (a file for dgl)")
    add_section(parser, "data", group=data)
    data.add_argument("--split", type=int, default=0, help="which split to use, for datasets with several")
    syn = parser.add_argument_group("synthetic graph (community-structured, power-law degrees)")
    syn.add_argument("--num-nodes", type=int, default=100_000)
    syn.add_argument("--avg-degree", type=float, default=10.0)
    syn.add_argument("--num-classes", type=int, default=10)
    syn.add_argument("--feat-dim", type=int, default=100)


def dataset_from_args(args: argparse.Namespace, *, map_features: bool = False) -> GraphDataset:
    """Load the dataset named by the options of :func:`add_dataset_arguments`; ``map_features``: an edge-list
    folder's features stay memory-mapped read-only (:func:`gnnscale.data.edgelist.load_edgelist`).

    Raises:
        ValueError: ``--dataset`` is missing, or needs ``--data-dir`` and got none.
        DatasetError: the data is missing or malformed (a ``ValueError`` too).
    """
    from gnnscale.data.loaders import load_dataset

    if args.dataset is None:
        raise ValueError("no --dataset given; pass --dataset and, except for synthetic, --data-dir")
    if args.dataset == "synthetic":
        return load_dataset("synthetic", None, num_nodes=args.num_nodes, avg_degree=args.avg_degree,
                            num_classes=args.num_classes, feat_dim=args.feat_dim, seed=args.seed)
    if args.data_dir is None:
        raise ValueError(f"--dataset {args.dataset} needs --data-dir pointing at its files")
    return load_dataset(args.dataset, args.data_dir,
                        **({"mmap_features": True} if map_features and args.dataset == "edgelist" else {}))
