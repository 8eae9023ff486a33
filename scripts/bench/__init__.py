"""Benchmark harness code that the benchmark scripts import, kept out of the installed package.

``scripts/bench/emulated.py``: the emulated cluster (network namespaces behind shaped links, needs
root), used by ``scripts/emulated_cluster.py``, ``scripts/bench_cluster.py`` and
``scripts/bench_distdgl_cluster.py``.  A training job never imports it, so ``pip install gnnscale``
does not ship it (``pyproject.toml`` installs ``gnnscale``, ``samplers`` and ``partition`` only).

Scripts import it as ``bench.emulated`` with ``scripts/`` on ``sys.path`` (a script run as
``python scripts/x.py`` has it there already; each also inserts it, for importlib and tests).
"""
