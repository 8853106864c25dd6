"""The README's usage examples run as written from a clone (issue 43).

The ``sh`` block under "## Usage" is read from README.md itself, split into commands
(backslash continuations joined, comments dropped) and run in order, exactly as written,
through the ``anchorage`` of this interpreter's environment, in a scratch directory that
holds only the repository's ``data/`` (so relative paths resolve as from the repository
root, outputs land in the scratch directory, and nothing beside the checkout is read:
``$ANCHORAGE_TRACES`` is unset). Each command must exit 0 and produce what it promises;
a command this file does not know how to check fails the test, so a new example gets a
check. ``up`` and ``drive`` start vLLM engines and are tested in ``tests/stack/``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, need

NOT_RUN_HERE = {"up", "drive"}  # the serving stack: tests/stack/test_stack_cli.py, e2e


def usage_commands(readme: str) -> list[list[str]]:
    """The commands of the first ``sh`` block after "## Usage", as argv lists."""
    section = readme.split("\n## Usage\n", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README's Usage section has no sh block"
    text = block.group(1).replace("\\\n", " ")
    cmds = []
    for line in text.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            cmds.append(argv)
    return cmds


def _table_rates(out: str, policy: str) -> list[float]:
    """The hit-rate column of ``policy``'s row(s) in `anchorage sim`'s table."""
    return [float(m.group(1)) for m in re.finditer(rf"^{re.escape(policy)}\s+([\d.]+)%", out, re.M)]


def check(argv: list[str], cwd: Path, out: str, err: str) -> None:
    """What each example promises, beyond exit status 0."""
    sub = argv[1]
    both = out + "\n" + err  # tables on stdout, the one-line summaries may go to stderr
    if "--help" in argv:
        assert out.startswith("usage: anchorage " + sub), out[:200]
        return
    if sub == "sim" and "--mode" not in argv:
        lru, belady = _table_rates(both, "lru"), _table_rates(both, "belady")
        assert len(lru) == len(belady) == 1, both
        assert 0 < lru[0] <= belady[0] <= 100, both
        trace = argv[argv.index("--trace") + 1]
        assert f"trace {trace}: 12031 requests" in both, both
        return
    if sub == "sim":  # timed, --json
        doc = json.loads(out)
        assert doc["mode"] == "timed" and doc["replicas"] == 4, doc
        assert [r["policy"] for r in doc["results"]] == ["lru", "hybrid"], doc["results"]
        for r in doc["results"]:
            assert 0 < r["hit_rate"] <= 1, r
        return
    if sub == "bench":
        doc = json.loads((cwd / "out" / "bench.json").read_text())
        assert {r["workload"] for r in doc["rows"]} == {"generated:pipeline", "mooncake"}, doc
        assert doc["policies"] == ["lru", "hybrid", "belady"], doc["policies"]
        assert "mooncake" in (cwd / "out" / "table.md").read_text()
        assert len(list((cwd / "out" / "plots").glob("*.png"))) == 2
        assert "skipping workload" not in err, err
        return
    if sub == "trace":
        from anchorage.trace.format import read_trace

        verb = argv[2]
        if verb == "generate":
            _, recs = read_trace(cwd / argv[argv.index("-o") + 1])
            sessions = int(argv[argv.index("--sessions") + 1])
            assert len({r.session_id for r in recs}) == sessions
            return
        if verb == "convert":
            _, recs = read_trace(cwd / argv[argv.index("-o") + 1])
            assert len(recs) == 1905 and len({r.session_id for r in recs}) == 94  # SOURCES.md
            return
        if verb == "stats":
            assert re.search(r"^requests\s+[\d,]+$", both, re.M), both
            assert "infinite-cache hit rate" in both, both
            return
    pytest.fail(f"README example {shlex.join(argv)!r} has no check in {__file__}")


def test_readme_usage_examples_run_as_written(tmp_path):
    exe = Path(sys.executable).parent / "anchorage"
    need(exe.exists(), f"the anchorage script beside {sys.executable}",
         "install the project into the environment (`make setup` or pip install -e .)")
    (tmp_path / "data").symlink_to(REPO / "data", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "ANCHORAGE_TRACES"}
    env.update(PATH=f"{exe.parent}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1",
               PYTHONHASHSEED="0")
    cmds = usage_commands((REPO / "README.md").read_text())
    assert all(c[0] == "anchorage" for c in cmds), cmds
    assert {c[1] for c in cmds} >= {"sim", "bench", "trace"}, cmds
    ran = 0
    for argv in cmds:
        if argv[1] in NOT_RUN_HERE:
            continue
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (shlex.join(argv), proc.stderr[-3000:])
        assert "Traceback" not in proc.stderr, (shlex.join(argv), proc.stderr[-3000:])
        check(argv, tmp_path, proc.stdout, proc.stderr)
        ran += 1
    assert ran == len(cmds) - sum(c[1] in NOT_RUN_HERE for c in cmds) >= 9


def test_usage_commands_parses_continuations_and_comments():
    readme = ("# x\n\n## Usage\n\ntext\n\n```sh\n# a comment\nanchorage sim --trace a \\\n"
              "    --policies lru   # trailing\n\nanchorage up --x 1   # Ctrl-C\n```\n")
    assert usage_commands(readme) == [["anchorage", "sim", "--trace", "a", "--policies", "lru"],
                                      ["anchorage", "up", "--x", "1"]]
