"""Progress: a redrawn bar on a terminal, sparse plain lines in a log, nothing when disabled or short."""

import io

import pytest

from gnnscale.progress import Progress


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(stream: Stream, clock: Clock, steps: int, seconds_per_step: float, **kwargs) -> str:
    with Progress(steps, desc="epoch 1", stream=stream, clock=clock, **kwargs) as progress:
        for _ in range(steps):
            clock.now += seconds_per_step
            progress.update()
    return stream.getvalue()


@pytest.mark.parametrize("tty", [True, False])
def test_disabled_writes_nothing(tty):
    assert run(Stream(tty), Clock(), steps=100, seconds_per_step=1.0, enabled=False) == ""


def test_a_short_epoch_adds_nothing_to_a_log():
    assert run(Stream(False), Clock(), steps=100, seconds_per_step=0.05, enabled=True, interval_s=10.0) == ""


def test_a_long_epoch_writes_a_line_at_most_every_interval_and_the_last_count():
    lines = run(Stream(False), Clock(), steps=25, seconds_per_step=1.0, enabled=True, interval_s=10.0).splitlines()
    assert lines == ["epoch 1: 10/25 (40%), 1.00/s, 00:10 elapsed, ETA 00:15",
                     "epoch 1: 20/25 (80%), 1.00/s, 00:20 elapsed, ETA 00:05",
                     "epoch 1: 25/25 (100%), 1.00/s, 00:25 elapsed, ETA 00:00"]
    lines = run(Stream(False), Clock(), steps=20, seconds_per_step=1.0, enabled=True, interval_s=10.0).splitlines()
    assert len(lines) == 2  # the line at 20/20 is not repeated on close


def test_a_terminal_gets_one_line_redrawn_in_place():
    out = run(Stream(True), Clock(), steps=4, seconds_per_step=0.5, enabled=True)
    assert out.count("\n") == 1 and out.endswith("\n")
    frames = out.rstrip("\n").split("\r")[1:]
    assert len(frames) == 5  # every step (0.5 s apart is over the redraw limit) and the close
    assert frames[0].startswith("epoch 1:  25%|#####               | 1/4 [00:00<00:01, 2.00/s]")
    assert frames[-1] == "epoch 1: 100%|####################| 4/4 [00:02<00:00, 2.00/s]"


def test_a_terminal_is_not_redrawn_more_than_ten_times_a_second():
    out = run(Stream(True), Clock(), steps=1000, seconds_per_step=0.001, enabled=True)
    assert out.count("\r") == 11  # the first step, one per 0.1 s of the second, and the close
    assert "1000/1000" in out.split("\r")[-1]


def test_a_shorter_frame_blanks_what_the_longer_one_left():
    stream, clock = Stream(True), Clock()
    progress = Progress(10, desc="x", enabled=True, stream=stream, clock=clock)
    clock.now += 100.0
    progress.update()  # slow: the ETA is long
    clock.now += 0.2
    progress.update(9)
    first, second = stream.getvalue().split("\r")[1:]
    assert len(second) >= len(first)


def test_close_is_idempotent_and_an_unknown_total_still_draws():
    stream = Stream(True)
    progress = Progress(0, desc="warm-up", enabled=True, stream=stream, clock=Clock())
    progress.close()
    progress.close()
    assert stream.getvalue() == "\rwarm-up: 100%|####################| 0/0 [00:00<?, ?/s]\n"


@pytest.mark.parametrize("kwargs, message", [
    (dict(total=-1), "Progress total must be >= 0 steps, got -1"),
    (dict(total=1, interval_s=0.0), "Progress interval_s must be > 0 seconds, got 0.0"),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Progress(desc="x", enabled=True, **kwargs)
