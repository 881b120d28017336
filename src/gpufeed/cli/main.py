"""Entry point of the ``gpufeed`` command. Subcommands register in ``COMMANDS`` as they land."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import gpufeed

from . import bench, cache, convert, diagnose, train, tune

# name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "bench": (bench.HELP, bench.add_arguments, bench.run),
    "cache": (cache.HELP, cache.add_arguments, cache.run),
    "convert": (convert.HELP, convert.add_arguments, convert.run),
    "diagnose": (diagnose.HELP, diagnose.add_arguments, diagnose.run),
    "train": (train.HELP, train.add_arguments, train.run),
    "tune": (tune.HELP, tune.add_arguments, tune.run),
}


DEBUG_ENV = "GPUFEED_DEBUG"
_DEBUG_HELP = f"show the full traceback of an error (or set {DEBUG_ENV}=1)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufeed", description="Keep a PyTorch GPU fed.")
    parser.add_argument("--version", action="version", version=f"gpufeed {gpufeed.__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add_arguments, run) in sorted(COMMANDS.items()):
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        # SUPPRESS: given before the command, the subcommand's default must not reset it.
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
        p.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; gpufeed's typed errors and errors about the user's files print as one message, status 2."""
    import os
    import sys

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the launcher re-runs the command with it
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 0
    if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        return int(args.run(args))
    try:
        return int(args.run(args))
    except (gpufeed.GpufeedError, OSError) as e:  # OSError: a path of the user's (unreadable, full disk)
        kind = type(e).__name__
        print(f"gpufeed {args.command}: {kind}: {e}", file=sys.stderr)
        print(f"(run with --debug or {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gpufeed {args.command}: interrupted", file=sys.stderr)
        return 130
