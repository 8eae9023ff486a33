"""Heterogeneous ranks (Poplar): each global step's seeds shared among ranks in proportion to their speed.

A step stays the single-machine step on the union of its seeds (the loss is scaled by the step's
global seed count, so the summed gradient does not depend on who trained which seed); only the
split changes.  Each rank first takes its own seeds of the step (their rows and neighbours are
local) up to its quota; the surplus of ranks over quota goes, in rank order, to ranks under it.

A rank's speed is measured as the seeds per second of a few of its own steps run alone: sampled on
the replicated structure, rows read locally, forward and backward, no collective (so no peer's pace
is in it), wall-clock (so a machine whose cores are throttled or shared counts as slow).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def parse_capacity(text: str | None, world_size: int) -> str | list[float] | None:
    """``--rank-capacity``: None, ``"auto"``, or one positive weight per rank normalised to sum 1.

    Raises:
        ValueError: neither auto nor ``world_size`` positive finite numbers.
    """
    if text is None or text == "auto":
        return text
    try:
        weights = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--rank-capacity {text!r} is neither auto nor comma-separated numbers, e.g. 2,1") from None
    if len(weights) != world_size:
        raise ValueError(f"--rank-capacity {text!r} gives {len(weights)} weight(s) for {world_size} ranks; give one "
                         f"per rank, e.g. {','.join(['1'] * world_size)}, or auto")
    if not all(w > 0 and w != float("inf") for w in weights):
        raise ValueError(f"--rank-capacity {text!r}: every weight must be a positive finite number")
    return [w / sum(weights) for w in weights]


def quotas(total: int, shares: Sequence[float]) -> list[int]:
    """``total`` seeds split in proportion to ``shares`` (summing to 1): largest remainders, ties to lower ranks."""
    exact = [total * s for s in shares]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda r: (-(exact[r] - counts[r]), r))
    for r in by_remainder[:total - sum(counts)]:
        counts[r] += 1
    return counts


def share_steps(own: list[list[Tensor]], shares: Sequence[float]) -> list[list[Tensor]]:
    """Per rank and step, the seeds it trains: ``plan[r][s]``, ``quotas(step total, shares)[r]`` of them.

    Args:
        own: ``own[r][s]``, rank ``r``'s own seeds of step ``s`` (every rank lists the same number of steps).
        shares: each rank's share of every step, summing to 1.
    """
    ranks, steps = len(own), len(own[0])
    plan: list[list[Tensor]] = [[] for _ in range(ranks)]
    for step in range(steps):
        chunks = [own[r][step] for r in range(ranks)]
        quota = quotas(sum(c.numel() for c in chunks), shares)
        surplus = torch.cat([c[quota[r]:] for r, c in enumerate(chunks)])
        taken = 0
        for r, chunk in enumerate(chunks):
            kept = chunk[:quota[r]]
            short = quota[r] - kept.numel()
            plan[r].append(torch.cat([kept, surplus[taken:taken + short]]) if short > 0 else kept)
            taken += max(short, 0)
    return plan


def shares_from_speed(seeds: Sequence[float], seconds: Sequence[float]) -> list[float]:
    """Shares in proportion to each rank's seeds per second (equal where a measure is missing)."""
    speeds = [n / b if b > 0 and n > 0 else 0.0 for n, b in zip(seeds, seconds)]
    if not all(s > 0 for s in speeds):
        return [1.0 / len(speeds)] * len(speeds)
    return [s / sum(speeds) for s in speeds]
