"""Reading Prometheus text exposition (an engine's or node agent's ``/metrics``).

The one home of parsing scraped ``/metrics`` text: the sidecar's engine load, the
router's replica gauges and the drive's before/after counters all read it here, through
``prometheus_client.parser`` (label values with escapes, ``}`` or spaces, histograms,
``_created`` samples, timestamps are its business, not ours).

- ``samples(text, names=None)``: every sample as ``(name, labels, value)``, in order (with
  ``names``, only samples so named); ``ValueError`` (one line, what the parser rejected)
  when the text read is not the text format.
- ``sums(text, names)``: for each of ``names`` present, the sum of its samples over their
  label sets; a NaN or infinite sample is left out of the sum (it measures nothing).
- ``has_samples(text, prefixes)``: some sample line's name starts with one of
  ``prefixes`` (comment lines do not count; nothing is parsed: a presence test).

Names match exactly (``vllm:num_requests_waiting`` is not
``vllm:num_requests_waiting_by_reason``). With ``names``, only the lines that start with
one of them reach the parser: it takes about 0.1 ms a sample, and an engine's ``/metrics``
has hundreds of samples, of which a scrape reads a handful.

``prometheus_client`` is imported on first use (it comes with the ``plugin``, ``vllm``,
``router`` and ``operator`` extras), so the core imports without it.
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator


def samples(text: str, names: Iterable[str] | None = None
            ) -> Iterator[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    want = None if names is None else set(names)
    if want is not None:
        starts = tuple(want)
        text = "".join(line + "\n" for line in text.splitlines() if line.startswith(starts))
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if want is None or s.name in want:
                    yield s.name, s.labels, float(s.value)
    except ValueError as exc:
        raise ValueError(f"not Prometheus text format: {exc or 'unreadable line'}") from None


def has_samples(text: str, prefixes: Iterable[str]) -> bool:
    starts = tuple(prefixes)
    return any(line.startswith(starts) for line in text.splitlines())


def sums(text: str, names: Iterable[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, _, value in samples(text, names):
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out
