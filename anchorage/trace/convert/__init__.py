"""Converters from public datasets into anchorage-trace/v1: one module per dataset, each
with ``convert(src, opts) -> (TraceHeader, [TraceRecord])``; this registry maps the
dataset names of `anchorage trace convert --from` to them (imported on use)."""

from __future__ import annotations

import importlib
import os

from anchorage.trace.convert.common import ConvertOptions
from anchorage.trace.format import TraceError, TraceHeader, TraceRecord

CONVERTERS = {
    "mooncake": "anchorage.trace.convert.mooncake",
    "weka": "anchorage.trace.convert.weka",
    "chatdev": "anchorage.trace.convert.chatdev",
    "swe-agent": "anchorage.trace.convert.swe_agent",
    "tracelab": "anchorage.trace.convert.tracelab",
    "azure": "anchorage.trace.convert.azure",
}

__all__ = ["CONVERTERS", "ConvertOptions", "convert"]


def convert(dataset: str, src: str | os.PathLike, opts: ConvertOptions | None = None
            ) -> tuple[TraceHeader, list[TraceRecord]]:
    """Convert ``src`` (a file or folder of ``dataset``). Raises ValueError on an unknown
    dataset or bad options and TraceError (file, line, problem) on bad input data."""
    if dataset not in CONVERTERS:
        raise ValueError(f"unknown dataset {dataset!r}; known: {', '.join(sorted(CONVERTERS))}")
    opts = opts or ConvertOptions()
    opts.validate()
    if not os.path.exists(src):
        raise TraceError(os.fspath(src), None, "no such file or directory")
    mod = importlib.import_module(CONVERTERS[dataset])
    return mod.convert(os.fspath(src), opts)
