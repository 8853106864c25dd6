"""The command line's conventions, the same in every command (anchorage/cli.py):
`--version`; `--json` prints one JSON object on stdout and nothing else there, a file goes
through `--json-out` (the old `--json FILE` still writes it, with a deprecation note);
exit 0 / 1 (runtime failure) / 2 (usage); progress only on a terminal; no library INFO
lines. Run as users run it: `python -m anchorage` in a subprocess (stdout and stderr are
pipes, not terminals)."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO

BENCH = ["bench", "--workloads", "generated:pipeline", "--policies", "lru,hybrid",
         "--capacities", "0.1", "--no-half-lru", "--sessions", "20"]


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anchorage", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_version():
    from anchorage import __version__

    p = cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"anchorage {__version__}"


def test_json_means_stdout_in_every_command(tmp_path):
    trace = tmp_path / "t.jsonl"
    p = cli("trace", "generate", "--topology", "pipeline", "--agents", "3", "--sessions", "5",
            "-o", str(trace))
    assert p.returncode == 0, p.stderr
    for args in (BENCH, ["trace", "stats", str(trace)],
                 ["sim", "--trace", str(trace), "--policies", "lru", "--capacity-frac", "0.2",
                  "--no-progress"]):
        p = cli(*args, "--json")
        assert p.returncode == 0, (args, p.stderr[-2000:])
        obj = json.loads(p.stdout)          # stdout is exactly one JSON object
        assert isinstance(obj, dict) and obj, args
    bench = json.loads(cli(*BENCH, "--json").stdout)
    assert set(bench) == {"machine", "policies", "rows"} and bench["policies"] == ["lru", "hybrid"]


def test_json_out_writes_the_file_and_the_old_spelling_still_works(tmp_path):
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    p = cli(*BENCH, "--json-out", str(new))
    assert p.returncode == 0 and "hybrid" in p.stdout      # the table still on stdout
    assert "deprecated" not in p.stderr
    p = cli(*BENCH, "--json", str(old))              # the contract before --json-out
    assert p.returncode == 0
    assert "`--json FILE` is deprecated; use `--json-out FILE`" in p.stderr
    a, b = json.loads(new.read_text()), json.loads(old.read_text())
    assert set(a) == set(b) == {"machine", "policies", "rows"}
    def rates(d):
        return [{k: v["hit_rate"] for k, v in r["results"].items()} for r in d["rows"]]

    assert rates(a) == rates(b)


def test_exit_status_usage_vs_runtime_failure(tmp_path):
    p = cli("bench", "--capacities", "seven")              # a bad value: usage
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert cli("bench", "--no-such-option").returncode == 2      # argparse: usage
    with socket.socket() as s:                              # a port in use: runtime
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = cli("node-agent", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path))
    assert p.returncode == 1 and "cannot listen" in p.stderr and "Traceback" not in p.stderr


def test_no_progress_and_no_library_info_lines_off_a_terminal():
    p = cli(*BENCH)
    assert p.returncode == 0
    lines = p.stderr.splitlines()
    # the per-policy progress lines (`... hit 12.34%`) only show on a terminal
    assert not [ln for ln in lines if re.search(r" hit \d+\.\d+%$", ln)], p.stderr
    assert not [ln for ln in lines if " INFO " in ln], p.stderr


def test_logging_levels():
    from anchorage.cli import configure_logging

    root, anchorage = logging.getLogger(), logging.getLogger("anchorage")
    saved = root.level, anchorage.level, list(root.handlers)
    # (other tests' imports set levels on these loggers, e.g. vLLM's: start from none)
    others = [logging.getLogger(n) for n in ("httpx", "anchorage.router")]
    saved_others = [(lg.level, lg.disabled) for lg in others]
    disabled = logging.root.manager.disable
    try:
        logging.disable(logging.NOTSET)
        for lg in others:
            lg.setLevel(logging.NOTSET)
            lg.disabled = False
        root.handlers.clear()
        configure_logging(False)
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert logging.getLogger("anchorage.router").isEnabledFor(logging.INFO)
        root.handlers.clear()
        anchorage.setLevel(logging.NOTSET)
        configure_logging(True)
        assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
    finally:
        root.setLevel(saved[0])
        anchorage.setLevel(saved[1])
        root.handlers[:] = saved[2]
        for lg, (level, was_disabled) in zip(others, saved_others):
            lg.setLevel(level)
            lg.disabled = was_disabled
        logging.disable(disabled)


@pytest.mark.parametrize("args", [["sim", "--help"], ["bench", "--help"], ["demo", "--help"]])
def test_help_names_json_out(args):
    p = cli(*args)
    assert p.returncode == 0
    if args[0] in ("bench", "demo"):
        assert "--json-out" in p.stdout
