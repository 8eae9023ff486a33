"""Time gloo all-reduces of a few sizes between the ranks of a job: the fixed cost every step pays.

    sudo python scripts/emulated_cluster.py --rate 10gbit -- scripts/probe_collectives.py
    torchrun --standalone --nproc_per_node=2 scripts/probe_collectives.py

Rank 0 prints, per size, the mean wall and CPU milliseconds of 200 all-reduces after 20 warm-ups.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

SIZES = (10, 3_500, 100_000)
"""floats: a scalar's worth, a small model's gradient, a larger one."""


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for size in SIZES:
        values = torch.ones(size)
        for _ in range(20):
            dist.all_reduce(values)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(200):
            dist.all_reduce(values)
        wall, cpu = (time.perf_counter() - wall) / 200, (time.process_time() - cpu) / 200
        if rank == 0:
            print(f"all-reduce of {size:>7,} floats over {dist.get_world_size()} ranks: {wall * 1e3:.3f} ms wall, "
                  f"{cpu * 1e3:.3f} ms CPU", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
