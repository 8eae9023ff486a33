"""The least a partition may get: at least one node, and under ``--part-weights`` at least one training node.

The partition command has no batch size, so "one batch" cannot be its yardstick; one training node is the
documented minimum (docs/partitioning.md): a rank without one has nothing to train on, while every rank
takes the same number of steps.  The trainer checks the rest at launch, where the batch size is known
(a partition with fewer training nodes than steps per epoch is refused there).

:func:`check_minimum_shares` refuses weights whose *targets* fall short, before any work;
:func:`check_assignment` refuses an assignment that left a partition short anyway, before anything is
written.
"""

from __future__ import annotations

import math

import numpy as np

from partition.config import PartitionConfig

# A share exactly at the minimum may be a hair below it after normalisation: not short.
_SLACK = 1e-9


def check_minimum_shares(config: PartitionConfig, num_train: int, name: str) -> None:
    """Refuse ``config.part_weights`` under which a partition's target is under one training node.

    Args:
        num_train: training nodes of ``config.split`` (a dataset has at least one in every split).
        name: the dataset's name, for the message.

    Raises:
        ValueError: naming the weights, the partitions short of one unit, and the smallest weights (the
            others as given) that give each at least one.
    """
    if config.part_weights is None:
        return
    units, what = num_train, f"training nodes (split {config.split})"
    text = ",".join(config.weights_given)
    short = [p for p, share in enumerate(config.part_weights) if share * units < 1 - _SLACK]
    if not short:
        return
    if units < config.num_parts:
        raise ValueError(f"--part-weights {text!r}: {name} has {units:,} {what}, fewer than the {config.num_parts} "
                         f"partitions, and every partition needs at least one; use --num-parts {units} or fewer")
    raised = raised_weights([float(w) for w in config.weights_given], units)
    fixed = ",".join(given if new is None else _format(new) for given, new in zip(config.weights_given, raised))
    targets = ", ".join(f"{config.part_weights[p] * units:.3g}" for p in short)
    raise ValueError(f"--part-weights {text!r} give partition(s) {short} less than one of the {units:,} {what} of "
                     f"{name} (target: {targets}); every partition needs at least one, or its rank has nothing to "
                     f"train on. The smallest weights that give it, the others as given: --part-weights {fixed}")


def check_assignment(config: PartitionConfig, parts: np.ndarray, train_mask: np.ndarray, name: str) -> None:
    """Refuse an assignment that leaves a partition without nodes, or, under ``--part-weights``, without a
    training node.

    Args:
        parts: int64 [num_nodes], each node's partition.
        train_mask: bool [num_nodes], the training nodes of ``config.split``.

    Raises:
        ValueError: naming the partitions, and the weights where given.
    """
    sizes = np.bincount(parts, minlength=config.num_parts)
    empty = np.flatnonzero(sizes == 0).tolist()
    if config.part_weights is None:
        if empty:
            raise ValueError(f"partition(s) {empty} would own no nodes: {config.method} could not split {name} "
                             f"({parts.shape[0]:,} nodes) into {config.num_parts} non-empty parts; use fewer "
                             f"--num-parts" + (", or --method random" if config.method == "metis" else ""))
        return
    num_train = int(np.count_nonzero(train_mask))
    short = np.flatnonzero(np.bincount(parts[train_mask], minlength=config.num_parts) == 0).tolist()
    if short:
        targets = ", ".join(f"{config.part_weights[p] * num_train:.3g}" for p in short)
        raise ValueError(f"--part-weights {','.join(config.weights_given)!r}: partition(s) {short} would get none "
                         f"of the {num_train:,} training nodes (split {config.split}) of {name} (their targets: "
                         f"{targets}): {config.method} could not reach their shares; raise their weights, or balance "
                         f"training nodes with --method metis --balance nodes,train")


def raised_weights(values: list[float], units: int) -> list[float | None]:
    """The smallest raises of ``values`` (positive weights) after which every partition's share of ``units``
    (>= ``len(values)``) is at least one; ``None`` where a weight stays.

    The short partitions all rise to one weight ``m`` with ``m / (rest + count * m) = 1 / units``, i.e.
    ``m = rest / (units - count)`` (``rest``: the sum of the others), rounded up; raising them lowers the
    others' shares, so any of those that this leaves short joins them, until none does.
    """
    raised: set[int] = {p for p, value in enumerate(values) if value * units < (1 - _SLACK) * sum(values)}
    while True:
        rest = math.fsum(value for p, value in enumerate(values) if p not in raised)
        level = _round_up(rest / (units - len(raised))) if rest else max(values)
        total = rest + len(raised) * level
        joining = {p for p, value in enumerate(values) if p not in raised and value * units < (1 - _SLACK) * total}
        if not joining:
            return [level if p in raised else None for p in range(len(values))]
        raised |= joining


def _round_up(value: float) -> float:
    """``value`` (> 0) rounded up to three significant digits."""
    exponent = math.floor(math.log10(value)) - 2
    # An integer step stays exact in floating point; a fractional one is applied as a division.
    if exponent >= 0:
        return float(math.ceil(value / 10 ** exponent) * 10 ** exponent)
    return math.ceil(value * 10 ** -exponent) / 10 ** -exponent


def _format(value: float) -> str:
    return str(int(value)) if value.is_integer() and value < 1e15 else format(value, ".3g")
