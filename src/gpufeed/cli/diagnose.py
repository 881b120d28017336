"""``gpufeed diagnose``: is the GPU waiting on data? Two forms:

- ``gpufeed diagnose [--steps N] [--time S] [--out DIR] [--no-side] -- CMD ...``: your own training command, run
  unchanged and measured from outside (:mod:`gpufeed.watch`);
- ``gpufeed diagnose [options of gpufeed train]``: a configuration of ``gpufeed train``, without writing code.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ..watch.spread import VERIFY_RUNS, VERIFY_S
from .common import output_dir
from .train import add_run_arguments, config_from

HELP = (
    "is the GPU waiting on data? run your training command (-- python train.py ...) or a configuration for some "
    "steps and print the verdict and the fix"
)

USAGE = """%(prog)s [--steps N] [--time S] [--out DIR] [--no-side | --side-seconds S]
                  [--verify [--verify-runs N] [--verify-seconds S]] -- CMD ...
       %(prog)s [options of gpufeed train] [--steps N] [--out DIR]"""

EPILOG = """examples:
  gpufeed diagnose -- python train.py --lr 0.1        your script, unchanged: stops after --steps batches
  gpufeed diagnose --verify -- python train.py        then runs it and a copy with the fix applied, interleaved
                                                      (A B B A A B), and compares both sides' times per step
                                                      (median and range) with the prediction
  gpufeed diagnose --time 120 -- torchrun --nproc-per-node 4 train.py
  gpufeed diagnose -- python -m mypackage.train
  gpufeed diagnose --loader torch --num-workers 4     a configuration of gpufeed train
  gpufeed diagnose --data s3://bucket/in1k-mds --local /scratch/in1k --cache-limit 200gb
                                                      gpufeed train on an MDS dataset (gpufeed.stream)

Everything after the first -- is the command, exactly as you run it (its own options included). Its output
shows as usual; then the report prints: the verdict, the wait fraction, each DataLoader as found, what
gf.accelerate does with that dataset measured beside it (within --side-seconds: a part of the data that fits,
extrapolated), the training loop's step predicted with the fix, its one-time cost and what it stores where, and
the line to change (the whole diff in OUT/fix.diff, and the command that applies it from any folder:
cd DIR && patch -p1 < OUT/fix.diff). Your files are never written."""

WATCH_STEPS = 100  # the command form's default --steps: enough past the workers' start for a stable fraction
CONFIG_STEPS = 50
_WATCH_OPTIONS = (
    "--steps", "--time", "--out", "--no-side", "--side-seconds", "--verify", "--verify-runs", "--verify-seconds",
    "--debug", "--help", "-h",
)  # fmt: skip
_NUMBER = re.compile(r"-?\d+(\.\d*)?([eE][-+]?\d+)?|-?\.\d+")  # an option's value, negative or not


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = USAGE
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "script",  # not "command": the top parser keeps the subcommand's name there
        nargs="*",
        metavar="-- CMD ...",
        help="after --: the training command to diagnose, as you run it (python train.py ..., torchrun ..., "
        "python -m package.module)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help=f"batches to measure: with a command, stop it after N batches of a loader (default {WATCH_STEPS}; 0: "
        f"let it finish); with a configuration, training steps (default {CONFIG_STEPS})",
    )
    p.add_argument(
        "--time",
        type=float,
        default=None,
        metavar="S",
        help="with a command: interrupt it S seconds after its first batch",
    )
    p.add_argument(
        "--out",
        type=output_dir,
        default=Path("diagnose-out"),
        metavar="DIR",
        help="folder for report.md/json, timeline.png",
    )
    p.add_argument(
        "--no-side",
        action="store_true",
        help="with a command: skip the side measurement (gf.accelerate on the script's dataset after its steps)",
    )
    p.add_argument(
        "--side-seconds",
        type=float,
        default=None,
        metavar="S",
        help="with a command: the side measurement's budget (default 20 s): a part of the dataset that fits is "
        "measured and the figures extrapolated to the whole",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="with a command: then run it and a copy of the script with the suggested change applied (never your "
        "file), interleaved (A B B A A B), each for the same steps, and report each run, both sides' median and "
        "range of the time per step, the gain with its range and whether the prediction agrees",
    )
    p.add_argument(
        "--verify-runs",
        type=int,
        default=None,
        metavar="N",
        help=f"with --verify: the runs, original and changed interleaved (default {VERIFY_RUNS}: A B B A A B; an "
        "even number, or 1: the changed copy once against the diagnosis run, no spread)",
    )
    p.add_argument(
        "--verify-seconds",
        type=float,
        default=None,
        metavar="S",
        help=f"with --verify: the verification's budget (default {VERIFY_S:g} s): after the first pair, a pair "
        "runs only when it fits in what is left (estimated from the latest run of each side)",
    )
    add_run_arguments(p)


def run(args: argparse.Namespace) -> int:
    command = _command(args)
    if command:
        return _watch(args, command)
    from ..errors import ConfigError

    for option, given in (
        ("--time", args.time is not None),
        ("--no-side", args.no_side),
        ("--side-seconds", args.side_seconds is not None),
        ("--verify", args.verify),
        ("--verify-runs", args.verify_runs is not None),
        ("--verify-seconds", args.verify_seconds is not None),
    ):
        if given:
            raise ConfigError(f"{option} goes with a command to diagnose: gpufeed diagnose {option} ... -- CMD ...")
    return _configuration(args)


def _command(args: argparse.Namespace) -> list[str]:
    """Everything after the first ``--`` of the command line (argparse keeps later ``--`` but not always the
    first, so the command is cut from the raw arguments, not from the parsed ones)."""
    from ..errors import ConfigError

    argv = list(getattr(args, "argv", None) or [])
    if "--" not in argv:
        if args.script:
            raise ConfigError(
                f"unexpected {' '.join(args.script)!r}: put the command to diagnose after --, as in "
                f"gpufeed diagnose -- {' '.join(args.script)}"
            )
        return []
    cut = argv.index("--")
    ours = argv[argv.index("diagnose") + 1 : cut] if "diagnose" in argv[:cut] else argv[:cut]
    for token in ours:
        name = token.split("=", 1)[0]
        if _NUMBER.fullmatch(token):  # a value (--steps -3): checked with its option
            continue
        if name.startswith("-") and not any(option.startswith(name) for option in _WATCH_OPTIONS):
            raise ConfigError(
                f"{name} is an option of a gpufeed train configuration, not of a command to diagnose: "
                "the command's own options go after --"
            )
    if not argv[cut + 1 :]:
        raise ConfigError("nothing after --: give the training command, as in gpufeed diagnose -- python train.py")
    return argv[cut + 1 :]


def _watch(args: argparse.Namespace, command: list[str]) -> int:
    from ..errors import ConfigError
    from ..watch.run import watch

    steps = WATCH_STEPS if args.steps is None else args.steps
    if steps < 0:
        raise ConfigError(f"--steps {steps} is out of range: the batches to measure must be >= 0 (0: let the command "
                          "finish)")  # fmt: skip
    if args.time is not None and not 0 < args.time < float("inf"):
        raise ConfigError(f"--time {args.time:g} is out of range: the seconds after the first batch must be > 0")
    if args.side_seconds is not None and not 0 < args.side_seconds < float("inf"):
        raise ConfigError(f"--side-seconds {args.side_seconds:g} is out of range: the budget must be > 0 seconds")
    if args.no_side and args.side_seconds is not None:
        raise ConfigError("--no-side and --side-seconds contradict each other: give one")
    for option, given in (("--verify-runs", args.verify_runs), ("--verify-seconds", args.verify_seconds)):
        if given is not None and not args.verify:
            raise ConfigError(f"{option} {given:g} goes with --verify: gpufeed diagnose --verify {option} ... -- CMD")
    runs = VERIFY_RUNS if args.verify_runs is None else args.verify_runs
    if runs < 1 or (runs > 1 and runs % 2):
        raise ConfigError(
            f"--verify-runs {runs} is out of range: give an even number of runs (pairs of the original and the "
            "changed script, A B B A ...), or 1 (the changed copy once, against the diagnosis run)"
        )
    budget = VERIFY_S if args.verify_seconds is None else args.verify_seconds
    if not 0 < budget < float("inf"):
        raise ConfigError(f"--verify-seconds {budget:g} is out of range: the verification's budget must be > 0 s")
    missing = _missing_script(command)
    if missing is not None:
        raise ConfigError(
            f"the script {missing!r} does not exist (looked for from {os.getcwd()}): the command never started; "
            "check the path"
        )
    try:
        _, status = watch(
            command, steps, args.time, args.out, side=not args.no_side, verify=args.verify,
            side_seconds=args.side_seconds, verify_runs=runs, verify_seconds=budget,
        )  # fmt: skip
    except KeyboardInterrupt:  # between the runs: reading the records, writing the report
        print(
            "gpufeed diagnose: interrupted while the report was being made; nothing was changed in your files",
            file=sys.stderr,
        )
        return 130
    return status


def _missing_script(command: list[str]) -> str | None:
    """The ``.py`` file the command names that does not exist (``python train.py`` from the wrong folder)."""
    for token in command:
        if token in ("-m", "-c", "--module"):
            return None
        if token.endswith(".py") and not token.startswith("-"):
            return None if os.path.exists(token) else token
    return None


def _configuration(args: argparse.Namespace) -> int:
    from ..diagnose import diagnose
    from ..train.loop import prepare
    from .common import DEFAULT_BATCH_SIZE, describe_run, lead, load_train_test, settle_batch_size, training_images

    steps = CONFIG_STEPS if args.steps is None else args.steps
    config_from(args, batch_size=args.batch_size or DEFAULT_BATCH_SIZE)  # checked before the data is read
    datasets = load_train_test(args, args.train_size, args.test_size)
    settle_batch_size(args, datasets[0], args.train_size)
    cfg = config_from(args, progress=False)
    prepared = prepare(cfg, datasets)
    try:
        if lead():
            images = training_images(datasets[0], args.train_size)
            print("\n".join(describe_run(prepared, images, cfg.batch_size)), flush=True)
        report = diagnose(prepared.loader, lambda batch: prepared.step(*batch), steps=steps, device=prepared.device)
    finally:
        prepared.close()  # a stream's shards and cache directory
    print(report)
    print(f"wrote {report.save(args.out)}")
    return 0
