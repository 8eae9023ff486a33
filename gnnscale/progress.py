"""Progress within an epoch, without a dependency: a one-line bar on a terminal, sparse lines in a log.

    with Progress(len(loader), desc=f"epoch {epoch}", enabled=is_main and not quiet) as progress:
        for batch in loader:
            ...
            progress.update()

On a TTY the line is redrawn in place (``\\r``): count/total, percent, rate, elapsed and ETA.
Elsewhere (a log file, CI) a plain line is written at most every ``interval_s`` seconds, so
an epoch shorter than that adds nothing to the log.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

_REDRAW_S = 0.1  # a terminal redraw at most this often: drawing every step would cost more than small steps


def _clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """Counts steps towards ``total`` and shows how far along they are.

    Args:
        total: steps expected, >= 0.
        desc: what is counted, shown first, e.g. ``"epoch 3"``.
        enabled: ``False`` writes nothing (other ranks, ``--quiet``).
        stream: where to write; a bar if it is a TTY, sparse plain lines otherwise.
        interval_s: seconds between plain lines (and before the first one).
        clock: seconds from a monotonic clock; a fake one in tests.
    """

    def __init__(self, total: int, *, desc: str, enabled: bool, stream: TextIO = sys.stderr,
                 interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        if total < 0:
            raise ValueError(f"Progress total must be >= 0 steps, got {total}")
        if interval_s <= 0:
            raise ValueError(f"Progress interval_s must be > 0 seconds, got {interval_s}")
        self.total, self.desc, self.enabled, self.stream = total, desc, enabled, stream
        self.interval_s, self.clock = interval_s, clock
        self.count = 0
        self._tty = enabled and getattr(stream, "isatty", lambda: False)()
        self._start = self._last = clock()
        self._written = 0  # characters of the bar on screen (TTY) or plain lines written (otherwise)
        self._shown = 0  # the count the last plain line showed
        self._closed = False

    def update(self, n: int = 1) -> None:
        """Count ``n`` more steps, and show them if it is time to."""
        self.count += n
        if not self.enabled or self._closed:
            return
        now = self.clock()
        if self._tty and (now - self._last >= _REDRAW_S or self._written == 0):
            self._draw(now)
        elif not self._tty and now - self._last >= self.interval_s:
            self._line(now)

    def close(self) -> None:
        """Show the final count: finish the bar, or write a last line if lines were written but not this count."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        now = self.clock()
        if self._tty:
            self._draw(now)
            self.stream.write("\n")
            self.stream.flush()
        elif self._written and self._shown != self.count:
            self._line(now)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _figures(self, now: float) -> tuple[str, str, str]:
        """Percent, rate and ETA as text."""
        elapsed = now - self._start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        percent = f"{100 * self.count / self.total:3.0f}%" if self.total else "100%"
        eta = _clock_text(max(0, self.total - self.count) / rate) if rate > 0 else "?"
        return percent, f"{rate:.2f}/s" if rate > 0 else "?/s", eta

    def _draw(self, now: float) -> None:
        percent, rate, eta = self._figures(now)
        filled = 20 * min(self.count, self.total) // self.total if self.total else 20
        text = (f"{self.desc}: {percent}|{'#' * filled}{' ' * (20 - filled)}| {self.count}/{self.total} "
                f"[{_clock_text(now - self._start)}<{eta}, {rate}]")
        # Pad with blanks over what a longer previous line left on screen.
        self.stream.write("\r" + text.ljust(self._written))
        self.stream.flush()
        self._written, self._last = len(text), now

    def _line(self, now: float) -> None:
        percent, rate, eta = self._figures(now)
        self.stream.write(f"{self.desc}: {self.count}/{self.total} ({percent.strip()}), {rate}, "
                          f"{_clock_text(now - self._start)} elapsed, ETA {eta}\n")
        self.stream.flush()
        self._written, self._shown, self._last = self._written + 1, self.count, now
