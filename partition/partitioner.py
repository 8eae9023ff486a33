"""``partition_graph``: assign, relabel, write, checksum -- one stage after another, into an atomic folder."""

from __future__ import annotations

import datetime
import json
import logging
from importlib import metadata
from pathlib import Path

import numpy as np

from gnnscale.data.dataset import GraphDataset
from partition.assign import assign_parts
from partition.book import PartitionBook
from partition.config import PartitionConfig
from partition.format import FORMAT_NAME, FORMAT_VERSION, MANIFEST, ORIG2NEW, ArrayWriter
from partition.minimums import check_assignment, check_minimum_shares
from partition.report import StageMonitor, quality_figures
from partition.writer import atomic_directory, check_output, write_partitions

log = logging.getLogger("partition")


def partition_graph(dataset: GraphDataset, out_dir: str | Path, config: PartitionConfig, *, force: bool = False,
                    command: str | None = None, monitor: StageMonitor | None = None) -> dict:
    """Partition ``dataset`` into ``config.num_parts`` parts and write the folder ``out_dir``.

    The folder appears complete or not at all (:func:`~partition.writer.atomic_directory`).

    Args:
        out_dir: the partition folder to create (its layout: docs/partitioning.md).
        force: replace an existing partition folder (only once the new one is complete).
        command: the command line to record in the manifest.
        monitor: stage timer to continue (the command line times loading with it); a new
            one logging to the ``partition`` logger otherwise.

    Returns:
        The manifest, as written to ``out_dir/manifest.json``.

    Raises:
        ValueError: ``num_parts`` exceeds the number of nodes, ``split`` does not exist, or a partition would
            be empty or, under ``part_weights``, without a training node (:mod:`partition.minimums`); raised
            before anything is written.
        FileExistsError: ``out_dir`` exists and ``force`` is off (or it is not a partition folder).
    """
    out = Path(out_dir)
    check_output(out, force)
    if config.num_parts > dataset.num_nodes:
        raise ValueError(f"num_parts={config.num_parts} exceeds the number of nodes of {dataset.name} "
                         f"({dataset.num_nodes:,}); pass --num-parts {dataset.num_nodes} or fewer")
    train_mask = dataset.split(config.split)[0]  # raises, naming the valid range, before any work
    check_minimum_shares(config, int(np.count_nonzero(train_mask)), dataset.name)
    monitor = monitor or StageMonitor(log.info)
    book, new2orig, assign_info = _assign_and_relabel(dataset, config, monitor)
    with atomic_directory(out, force=force) as tmp:
        writer = ArrayWriter(tmp)
        try:
            with monitor.stage("write"):
                writer.write(ORIG2NEW, book.orig2new)
                part_stats = write_partitions(dataset, book, new2orig, writer, halo_hops=config.halo_hops,
                                              split=config.split)
            # The writer thread hashes while writing; this stage is what remains after the last chunk.
            with monitor.stage("checksum"):
                files = writer.finish()
        except BaseException:
            writer.abort()
            raise
        quality = quality_figures(part_stats, dataset.num_edges, assign_info.get("balance", []),
                                  assign_info.get("metis_cut_undirected_edges"), shares=config.part_weights)
        manifest = build_manifest(dataset, config, book, part_stats, files, quality, assign_info,
                                  monitor.summary(), command)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
    return manifest


def _assign_and_relabel(dataset: GraphDataset, config: PartitionConfig,
                        monitor: StageMonitor) -> tuple[PartitionBook, np.ndarray, dict]:
    """The partition book, the new-to-original id map, and what the assignment reports (METIS cut, balance)."""
    with monitor.stage(config.method if config.method != "random" and config.num_parts > 1 else "assign"):
        parts, assign_info = assign_parts(dataset, config)
    check_assignment(config, parts, dataset.split(config.split)[0], dataset.name)
    with monitor.stage("relabel"):
        book, new2orig = PartitionBook.from_parts(parts, config.num_parts)
        del parts
    return book, new2orig, assign_info


def build_manifest(dataset: GraphDataset, config: PartitionConfig, book: PartitionBook, part_stats: list[dict],
                   files: dict, quality: dict, assign_info: dict, stages: dict, command: str | None) -> dict:
    """The ``manifest.json`` contents (field meanings: docs/partitioning.md)."""
    n, s = dataset.num_nodes, dataset.num_splits
    partitioning = {"method": config.method, "num_parts": config.num_parts, "seed": config.seed,
                    "balance_requested": list(config.balance), **assign_info}
    if config.part_weights is not None:  # optional: a folder without it has equal shares
        partitioning.update(part_weights=list(config.part_weights), split=config.split)
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "dataset": {"name": dataset.name, "source": dataset.source},
        "num_nodes": n,
        "num_edges": dataset.num_edges,
        "num_parts": book.num_parts,
        "node_ranges": [book.node_range(p) for p in range(book.num_parts)],
        "num_classes": dataset.num_classes,
        "metric": dataset.metric,
        "num_splits": s,
        "halo_hops": config.halo_hops,
        "node_data": {"features": {"dtype": str(dataset.features.dtype), "shape": [n, dataset.num_features]},
                      "labels": {"dtype": str(dataset.labels.dtype), "shape": [n, *dataset.labels.shape[1:]]},
                      **{name: {"dtype": "bool", "shape": [s, n]}
                         for name in ("train_masks", "val_masks", "test_masks")}},
        **({"edge_data": {"features": {"dtype": str(dataset.edge_features.dtype),
                                       "shape": list(dataset.edge_features.shape)}}}
           if dataset.edge_features is not None else {}),
        "partitioning": partitioning,
        "quality": quality,
        "stages": stages,
        "parts": part_stats,
        "files": dict(sorted(files.items())),
        "command": command,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gnnscale_version": _version(),
    }


def _version() -> str:
    try:
        return metadata.version("gnnscale")
    except metadata.PackageNotFoundError:
        return "unknown"
