"""The `anchorage` command line. Each subcommand lives in `anchorage.commands.<name>`,
which defines ``register(subparsers)``; heavy dependencies are imported only when the
subcommand runs, so `anchorage --help` stays fast and works without the extras."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Module names under anchorage.commands, in help order. A missing module is skipped so a
# partial install (core only) still has a working CLI.
COMMANDS = ["sim", "bench", "trace", "demo", "up", "drive", "node_agent", "router", "operator"]


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2, never a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anchorage",
        description="Keep multi-agent LLM workloads' KV cache warm: policies, traces, "
                    "simulator and the serving stack.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"anchorage.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("anchorage.commands"):
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from anchorage.trace.format import TraceError
    try:
        rc = args.func(args)
    except (CLIError, TraceError) as exc:
        print(f"anchorage {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # `python -m anchorage.cli`: run the one imported module, so
    from anchorage.cli import main as _main  # CLIError is the class the commands raise

    sys.exit(_main())
