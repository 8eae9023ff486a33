"""One configuration for the training command lines: shared option sections, recipe files, unused options.

``add_section(parser, "optimisation")`` adds a section's options, each defined once in
:data:`OPTIONS`, so an option of one meaning has one name, help and default in every command.
A command leaves out what it does not support (``without=``) and adds its own options to the
returned group.  ``parse_with_recipe`` reads ``--config FILE`` and ``warn_no_effect`` warns about
given options that cannot matter; what users see of both is in docs/training.md.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import re
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

log = logging.getLogger("gnnscale")

OPTIONS: dict[str, dict[str, Any]] = {
    "--data-dir": dict(type=Path, default=None, help="folder or file holding the data of --dataset"),
    "--seed": dict(type=int, default=0, help="seed of everything the command randomises: the synthetic "
                   "graph, initialisation, sampling, held-out nodes"),
    "--epochs": dict(type=int, default=10, help="passes over the training data"),
    "--lr": dict(type=float, help="Adam learning rate; the default is the model's"),
    "--weight-decay": dict(type=float, default=5e-4, help="Adam L2 penalty"),
    # Off by default: --epochs is then exactly what runs (the accuracy table's recipes were measured so,
    # without --patience); the best validation epoch is kept either way, early stopping only saves time.
    "--patience": dict(type=int, default=0, help="stop after this many evaluations without a better validation "
                       "score; 0 = off (the best epoch is kept either way)"),
    "--eval-every": dict(type=int, default=1, help="epochs between evaluations"),
    "--device": dict(default="cpu", help="cpu or cuda[:N]; under torchrun cuda means cuda:<local rank>"),
    # None: gnnscale.train.cli.default_num_workers (0 where a thread would only compete with training).
    "--num-workers": dict(type=int, default=None, help="loader threads that sample and gather batches ahead of "
                          "training; 0 = in the training thread (default: 1, or 0 on one core per rank for a "
                          "world of one or with --grad-sync late)"),
    "--prefetch": dict(type=int, default=2, help="batches prepared ahead of training (beyond those the workers "
                       "hold)"),
    "--features-on-device": dict(action="store_true", help="keep the whole feature table on the device and send "
                                 "only ids (cuda)"),
    "--no-keep-freed-memory": dict(dest="keep_freed_memory", action="store_false", help="return freed memory to "
                                   "the system after every step (slower: pages fault in again)"),
    # 120 s, not 60: see docs/distributed.md, Failures.
    "--failure-timeout": dict(type=float, default=120.0, help="seconds without an answer after which a rank is "
                              "declared dead or hung and the others stop, naming it"),
    "--out": dict(type=Path, default=None, help="run folder for metrics.json (and checkpoint.pt, with "
                  "--checkpoint-every); None = a folder under runs/ named after dataset, model, seed and ranks"),
    "--resume": dict(action="store_true", help="continue from <out>/checkpoint.pt if it exists (use with torchrun "
                     "--max-restarts)"),
    "--checkpoint-every": dict(type=int, default=1, help="epochs between checkpoints; 0 = never"),
    "--on-checkpoint-error": dict(choices=("stop", "warn"), default="stop", help="a checkpoint that cannot be "
                                  "written (full or read-only --out): stop the run with one error line, the last "
                                  "checkpoint intact, or warn once and train on (the result is still written)"),
    "--config": dict(type=Path, default=None, metavar="RECIPE.toml", help="read options from a TOML recipe "
                     "(keys: the long option names, e.g. num-layers = 2); options given here override it"),
    "--quiet": dict(action="store_true", help="log only warnings and the final result; no progress lines"),
}
"""Every option shared by the commands, by name: ``add_argument`` keywords."""

SECTIONS: dict[str, tuple[str, ...]] = {
    "data": ("--data-dir", "--seed"),
    "optimisation": ("--epochs", "--lr", "--weight-decay", "--patience", "--eval-every", "--device"),
    "loader": ("--num-workers", "--prefetch", "--features-on-device", "--no-keep-freed-memory"),
    "distributed": ("--failure-timeout",),
    "checkpoint": ("--out", "--resume", "--checkpoint-every", "--on-checkpoint-error"),
    "run": ("--config", "--quiet"),
}
"""Section title -> its shared options, in help order."""

RANGES: dict[str, tuple[float, float | None, bool]] = {
    **dict.fromkeys(("--epochs", "--batch-size", "--hidden", "--num-layers", "--heads", "--out-heads", "--eval-every",
                     "--memory-dim", "--time-dim", "--embedding-dim", "--num-neighbors",
                     "--eval-negatives", "--num-parts", "--num-nodes", "--feat-dim", "--sync-every",
                     "--num-events", "--num-negatives"), (1, None, True)),
    **dict.fromkeys(("--dropout", "--input-dropout", "--attn-dropout", "--new-node-fraction"), (0, 1, True)),
    **dict.fromkeys(("--weight-decay", "--patience", "--num-workers", "--checkpoint-every", "--cache-mb", "--split",
                     "--staleness", "--halo-hops", "--seed", "--prefetch", "--topology-budget-mb",
                     "--memory-cache-rows"), (0, None, True)),
    **dict.fromkeys(("--lr", "--failure-timeout", "--avg-degree", "--memory-budget"), (0, None, False)),
    "--num-classes": (2, None, True),
}
"""Valid values of numeric options, by name: ``(low, high, low_included)``; ``high`` is excluded, None = unbounded."""


class Parser(argparse.ArgumentParser):
    """argparse with a usage error as one line (the option, the problem, where to read more), status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


def check_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a numeric option outside :data:`RANGES`, naming the flag, the valid range and its default.

    Raises:
        ValueError: the first option out of range (NaN included).
    """
    for name, action in _long_options(parser).items():
        value = getattr(args, action.dest, None)
        if name not in RANGES or value is None or isinstance(value, (bool, str)):  # str: a word such as auto
            continue
        low, high, closed = RANGES[name]
        inside = (value >= low if closed else value > low) and (high is None or value < high)
        if not inside or (isinstance(value, float) and math.isnan(value)):
            valid = (">= " if closed else "> ") + str(low) + ("" if high is None else f" and < {high}")
            example = f" (default {action.default})" if action.default is not None else ""
            raise ValueError(f"{name} must be {valid}, got {value}{example}")


def check_out(path: Path, flag: str = "--out") -> None:
    """Refuse an output folder that is a file or cannot be created or written, before any work; creates nothing.

    Raises:
        ValueError: naming ``flag``, the path and what to do.
    """
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is an existing file, not a folder; choose another {flag}")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {path} cannot be created: {existing} is a file; choose another {flag}")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as err:
        raise ValueError(f"{flag} {path} cannot be written: creating a file in {existing} failed ({err.strerror}); "
                         f"choose a folder you can write to") from None


JOB_ERROR_GRACE_SECONDS = 3.0
"""How long a rank other than 0 waits before leaving with a :class:`JobOptionError` that rank 0 reports."""


class OutputError(RuntimeError):
    """A result or checkpoint could not be written (a full, read-only or immutable folder); the message is one
    line naming the folder and what was kept.  A command ends with it as one ``error:`` line and status
    :data:`EXIT_OUTPUT_ERROR`."""


class JobOptionError(ValueError):
    """Bad input that every rank of a job finds alike (the same options, world size and files): rank 0
    alone prints it, so a job refuses in one line, and the ranks leave the job as finished, not failed."""


EXIT_OUTPUT_ERROR = 1
"""Exit status of a run whose work was done (or stopped) but whose output could not be written."""


def write_failure_reason(error: BaseException) -> str:
    """Why a write failed, in a few words: ``strerror`` of an ``OSError``, else the first line of the message."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


WIRE_DTYPES = ("float32", "float16", "bfloat16", "int8")
"""``--wire-dtype`` choices: :data:`gnnscale.distributed.wire.WIRE_DTYPES`, without importing torch to parse."""
GRAD_SYNCS = ("step", "late")
"""``--grad-sync`` choices (:attr:`gnnscale.train.trainer.TrainConfig.grad_sync`)."""

PER_MODEL = frozenset({"lr"})
"""Destinations whose default each command sets for its model (through ``add_section(..., lr=...)``)."""


def add_section(parser: argparse.ArgumentParser, section: str, *, group: Any = None, without: Iterable[str] = (),
                **defaults: Any) -> Any:
    """Add the options of ``section`` (a :data:`SECTIONS` key) and return their argument group.

    Args:
        parser: the command's parser.
        section: which section; also the group's title.
        group: an argument group to add to instead of a new one (the command's own options first).
        without: options of the section this command does not support.
        defaults: defaults of the :data:`PER_MODEL` options, by destination, e.g. ``lr=0.01``.
    """
    assert set(defaults) <= PER_MODEL, f"only {sorted(PER_MODEL)} have per-model defaults, got {sorted(defaults)}"
    group = parser.add_argument_group(section) if group is None else group
    for name in SECTIONS[section]:
        if name not in without:
            kwargs = dict(OPTIONS[name])
            dest = kwargs.get("dest", name[2:].replace("-", "_"))
            if dest in defaults:
                kwargs["default"] = defaults[dest]
            assert "default" in kwargs or "action" in kwargs, f"{name} needs a per-model default"
            group.add_argument(name, **kwargs)
    return group


def recipe_argv(path: Path, parser: argparse.ArgumentParser) -> list[str]:
    """The command-line arguments a TOML recipe stands for, checked against ``parser``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not TOML, an unknown key, or a value the option refuses (naming key and file).
    """
    try:
        table = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path} is not valid TOML: {err}; write one 'key = value' per line, strings in quotes "
                         f"(see recipes/)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise FileNotFoundError(f"--config {path}: cannot be read ({getattr(err, 'strerror', None) or err}); give "
                                f"the path of a TOML recipe, e.g. recipes/cora-gcn.toml") from None
    actions = {name[2:]: action for name, action in _long_options(parser).items() if name != "--config"}
    argv = []
    for key, value in table.items():
        if key not in actions:
            raise ValueError(f"unknown key {key!r} in {path}; valid keys: {', '.join(sorted(actions))}")
        if actions[key].nargs == 0:
            if not isinstance(value, bool):
                raise ValueError(f"{key} in {path} is a switch: write {key} = true, or leave it out")
            argv += [f"--{key}"] if value else []
        else:
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            argv.append(f"--{key}={text}")  # one token, so "-1,-1" is not taken for an option
    exit_on_error, parser.exit_on_error = parser.exit_on_error, False
    try:
        parser.parse_known_args(argv)
    except argparse.ArgumentError as err:
        raise ValueError(f"{path}: {err}") from None
    finally:
        parser.exit_on_error = exit_on_error
    return argv


def parse_with_recipe(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` over the recipe its ``--config`` names, if any: command line > recipe > defaults.

    Raises:
        FileNotFoundError, ValueError: from :func:`recipe_argv`.
    """
    args = parser.parse_args(argv)
    if args.config is None:
        return args
    return parser.parse_args([*recipe_argv(args.config, parser), *argv])


@dataclass(frozen=True)
class NoEffect:
    """A given ``option`` has no effect when ``when(args, world_size)`` holds, for ``reason``."""

    option: str
    when: Callable[[argparse.Namespace, int], bool]
    reason: str


def given_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> set[str]:
    """Destinations whose value differs from the parser's default: given on the command line or in a recipe."""
    defaults = vars(parser.parse_args([]))
    return {dest for dest, value in vars(args).items() if value != defaults.get(dest)}


def warn_no_effect(parser: argparse.ArgumentParser, args: argparse.Namespace, rules: Iterable[NoEffect], *,
                   world_size: int) -> list[str]:
    """``log.warning`` once per given option that a rule says has no effect; returns those options."""
    given, warned = given_options(parser, args), []
    for rule in rules:
        dest = _long_options(parser)[rule.option].dest
        if dest in given and rule.option not in warned and rule.when(args, world_size):
            log.warning("%s has no effect: %s", rule.option, rule.reason)
            warned.append(rule.option)
    return warned


def run_command(parser: argparse.ArgumentParser, argv: list[str], run: Callable[[argparse.Namespace], Any],
                rules: Iterable[NoEffect]) -> int:
    """A training command's ``main``: parse (with ``--config``), check, warn on rank 0, ``run(args)``; the exit status.

    Options, their ranges and ``--out`` are checked before torch is imported, so a refusal takes
    a fraction of a second.  User errors (``ValueError``, ``FileNotFoundError``) end as one
    ``error:`` line and status 2.
    """
    try:
        args = parse_with_recipe(parser, argv)
        check_ranges(parser, args)
        check_out(args.out if args.out is not None else Path("runs"))
    except (ValueError, FileNotFoundError) as exc:
        if os.environ.get("LOCAL_RANK", "0") == "0":  # every rank of a host finds the same: one line per host
            print(f"error: {exc}", file=sys.stderr)
        return 2
    return _run(parser, args, run, rules)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, run: Callable[[argparse.Namespace], Any],
         rules: Iterable[NoEffect]) -> int:
    """:func:`run_command` past the checks that need no torch: run, and turn each way of ending into its status.

    A process of a distributed job ends within :data:`gnnscale.distributed.shutdown.EXIT_GRACE_SECONDS` of
    this return, whatever its interpreter's finalisation meets (see :func:`~gnnscale.distributed.shutdown.
    exit_deadline`).
    """
    from gnnscale import interrupt
    from gnnscale.distributed.env import read_env, share_cores
    from gnnscale.distributed.shutdown import exit_deadline
    from gnnscale.distributed.watchdog import PeerFailure

    distributed = "WORLD_SIZE" in os.environ and os.environ["WORLD_SIZE"] != "1"
    try:
        logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                            format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
        env = read_env()
        share_cores(env)  # process-wide settings belong here, in main, not in a constructor
        if env.is_main:  # every rank sees the same options: one warning is enough
            warn_no_effect(parser, args, rules, world_size=env.world_size)
        interrupt.install()
        with flags_in_errors(parser):
            run(args)
    except (PeerFailure, ValueError, FileNotFoundError, OutputError, KeyboardInterrupt) as exc:
        status = report_error(exc)
        assert status is not None
    else:
        status = 0
    finally:
        if distributed:
            exit_deadline()
    if distributed and status != 0:
        _exit_now(status)
    return status


def _exit_now(status: int) -> None:
    """End a rank that left its job with an error, skipping the interpreter's finalisation.  Its process groups
    may still be referenced (the error's traceback held the trainer) and may hold collectives queued for peers
    that left: destroying them waits for each to time out (``--failure-timeout``), longer than torchrun's 30 s
    grace.  Everything there is to keep was written and printed already."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def report_error(exc: BaseException) -> int | None:
    """Print the one line a command ends with for ``exc`` and return its exit status; None for an exception
    that is a bug (its traceback is the report).  Printed once: a rank leaving a job reports before it
    marks itself failed (:func:`gnnscale.distributed.job.joined_job`; torchrun may end it any moment
    after), and the command's own handler then finds it reported.

    Statuses: another rank died or hung, 3 (``EXIT_PEER_FAILURE``); user input, 2 (a
    :class:`JobOptionError` printed by rank 0 alone); an output not written, 1; Ctrl-C, 130.
    """
    from gnnscale.distributed.watchdog import EXIT_PEER_FAILURE, PeerFailure

    reported = getattr(exc, "_gnnscale_status", None)
    if reported is not None:
        return reported
    if isinstance(exc, PeerFailure):  # another rank died or hung: name it, and let torchrun restart the job
        status, line = EXIT_PEER_FAILURE, f"error: {exc}"
    elif isinstance(exc, (ValueError, FileNotFoundError)):  # user input problems
        status, line = 2, f"error: {exc}"
        if isinstance(exc, JobOptionError) and os.environ.get("RANK", "0") != "0":
            line = None
            # Rank 0 prints the job's line; torchrun stops every rank once one exits with an error (torch 2.15's
            # agent within a fraction of a second), so the others leave only after giving it time to.
            time.sleep(JOB_ERROR_GRACE_SECONDS)
    elif isinstance(exc, OutputError):  # what could be kept was (the result printed, the last checkpoint intact)
        status, line = EXIT_OUTPUT_ERROR, f"error: {exc}"
    elif isinstance(exc, KeyboardInterrupt):  # the loader's workers were stopped on the way out
        status, line = 130, "interrupted: no metrics.json written"
    else:
        return None
    if line is not None:  # one write: the ranks of a host share the terminal, and print() writes the newline apart
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    with contextlib.suppress(AttributeError):
        exc._gnnscale_status = status  # type: ignore[attr-defined]
    return status


def as_flags(parser: argparse.ArgumentParser, message: str) -> str:
    """A library error in the command's words: ``name='value'`` / ``name=value`` become ``--flag value``, and a
    bare argument ``name`` (with an underscore, or before "must") becomes ``--flag`` for every option of
    ``parser`` (the library names its arguments, never the command's flags)."""
    for flag, action in _long_options(parser).items():
        name = re.escape(action.dest)
        message = re.sub(rf"\b{name}='([^']*)'", rf"{flag} \1", message)
        message = re.sub(rf"\b{name}=(?=\S)", f"{flag} ", message)
        bare = rf"(?<![-\w.]){name}\b(?!=)" if "_" in action.dest else rf"(?<![-\w.]){name}(?= must\b)"
        message = re.sub(bare, flag, message)
    return message


@contextlib.contextmanager
def flags_in_errors(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Inside, a ``ValueError`` the library raises leaves with its message in the command's flags
    (:func:`as_flags`); the exception itself, and its type, are kept.  Use it inside the job's block as well,
    where a rank leaving with an error reports it before the command's own handler sees it."""
    try:
        yield
    except ValueError as exc:
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (as_flags(parser, exc.args[0]), *exc.args[1:])
        raise


def _long_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    # argparse keeps its option table private; it is the one complete list of what a command accepts.
    return {name: action for name, action in parser._option_string_actions.items()
            if name.startswith("--") and name != "--help"}
