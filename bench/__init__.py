"""Anchorage's benchmarks: one script per question, results in ``bench/results/`` and
BENCHMARKS.md. Run a script from the repository root as a module, e.g.
``.venv/bin/python -m bench.bench_policies --quick``; ``bench.harness`` is what they share
(job fan-out inline, as Ray tasks or on a process pool; the run cache; tables; result JSON
with metadata)."""
