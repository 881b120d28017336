"""Entry point of the ``gpufeed`` command. Subcommands register in ``COMMANDS`` as they land."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import gpufeed

from . import bench, cache, diagnose, train, tune

# name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "bench": (bench.HELP, bench.add_arguments, bench.run),
    "cache": (cache.HELP, cache.add_arguments, cache.run),
    "diagnose": (diagnose.HELP, diagnose.add_arguments, diagnose.run),
    "train": (train.HELP, train.add_arguments, train.run),
    "tune": (tune.HELP, tune.add_arguments, tune.run),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufeed", description="Keep a PyTorch GPU fed.")
    parser.add_argument("--version", action="version", version=f"gpufeed {gpufeed.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add_arguments, run) in sorted(COMMANDS.items()):
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the launcher re-runs the command with it
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 0
    return int(args.run(args))
