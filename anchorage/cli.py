"""The `anchorage` command line. Each subcommand lives in `anchorage.commands.<name>`,
which defines ``register(subparsers)``; heavy dependencies are imported only when the
subcommand runs, so `anchorage --help` stays fast and works without the extras.

Conventions every command follows:

- exit status 0 on success, 1 when the command was well formed but failed while running
  (``CommandFailed``: a service that would not start, a port in use, a missing extra,
  failed requests), 2 on a usage error (``CLIError``: a bad option or value, an input file
  that is missing or unreadable; argparse's own errors too); one line on stderr, never a
  traceback;
- ``--json`` prints one JSON object on stdout and nothing else there (the human-readable
  output moves to stderr); a file is written with ``--json-out FILE`` (``add_json_args``);
- progress (bars, live status lines) only when stderr is a terminal;
- logging: WARNING and above from libraries, INFO from Anchorage's own loggers; ``-v``
  shows everything at DEBUG.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Module names under anchorage.commands, in help order. A missing module is skipped so a
# partial install (core only) still has a working CLI.
COMMANDS = ["sim", "bench", "trace", "demo", "up", "drive", "node_agent", "router", "operator", "crds"]


class CLIError(Exception):
    """A usage error: printed as one line, exit status 2, never a traceback."""

    exit_code = 2


class CommandFailed(CLIError):
    """A well-formed command that failed while running: one line, exit status 1."""

    exit_code = 1


JSON_STDOUT = "-"


def add_json_args(p: argparse.ArgumentParser, what: str) -> None:
    """``--json`` (stdout) and ``--json-out FILE``. ``--json FILE``, the old spelling that
    wrote a file, still works (``json_targets`` warns that it is deprecated)."""
    p.add_argument("--json", nargs="?", const=JSON_STDOUT, default=None, metavar="FILE",
                   help=f"print {what} as one JSON object on stdout (the table goes to "
                        "stderr); `--json FILE` is deprecated: use --json-out FILE")
    p.add_argument("--json-out", metavar="FILE", default=None,
                   help=f"write {what} as JSON to FILE")


def json_targets(args, command: str) -> tuple[bool, str | None]:
    """(print on stdout?, file to write or None) from ``add_json_args``' options."""
    path = getattr(args, "json_out", None)
    value = getattr(args, "json", None)
    if value not in (None, JSON_STDOUT):
        print(f"anchorage {command}: warning: `--json FILE` is deprecated; use "
              "`--json-out FILE` (`--json` alone prints the JSON on stdout)", file=sys.stderr)
        path = path or value
    return value == JSON_STDOUT, path


def emit_json(obj, to_stdout: bool, path: str | None, **dump) -> None:
    """Write ``obj`` where ``json_targets`` says (both, one, or neither)."""
    import json
    from pathlib import Path

    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(obj, indent=1, **dump))
        except OSError as exc:
            raise CLIError(f"cannot write {path}: {exc.strerror or exc}") from None
    if to_stdout:
        sys.stdout.write(json.dumps(obj, **dump) + "\n")
        sys.stdout.flush()


def configure_logging(verbose: bool) -> None:
    """Libraries at WARNING, Anchorage's own loggers at INFO; everything at DEBUG with -v."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        logging.getLogger("anchorage").setLevel(logging.INFO)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anchorage",
        description="Keep multi-agent LLM workloads' KV cache warm: policies, traces, "
                    "simulator and the serving stack.")
    from anchorage import __version__

    parser.add_argument("--version", action="version", version=f"anchorage {__version__}")
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
    configure_logging(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from anchorage.trace.format import TraceError
    try:
        rc = args.func(args)
    except (CLIError, TraceError) as exc:
        print(f"anchorage {args.command}: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
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
