"""Ctrl-C that cannot be lost.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be when SIGINT arrives;
if that is a ``__del__`` method or a weakref callback (a tensor or a buffer being freed), the
exception is printed as "Exception ignored" and the program goes on.  :func:`install` keeps
that behaviour and also records the request, and :func:`check` (called by the input pipeline
before every batch) raises it again, so a training run always stops within a batch.
"""

from __future__ import annotations

import signal
import threading

_requested = threading.Event()


def install() -> None:
    """Record every SIGINT as well as raising ``KeyboardInterrupt`` (call from the main thread)."""
    _requested.clear()

    def on_sigint(signum, frame):  # noqa: ARG001 -- signal handler signature
        _requested.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGINT was recorded (the first raise may have been swallowed)."""
    if _requested.is_set():
        raise KeyboardInterrupt
