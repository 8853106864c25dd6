"""The fleet benchmark's core: peer stacks as named configurations, the memory hierarchy,
one run of a stack in the timed simulator, and the metrics (``bench/bench_fleet.py``)."""
