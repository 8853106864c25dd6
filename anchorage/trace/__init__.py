"""Traces: the `anchorage-trace/v1` format, converters, the generator and statistics."""

from anchorage.trace.format import (FORMAT, TraceError, TraceHeader, TraceReader, TraceRecord,
                                    read_trace, write_trace)

__all__ = ["FORMAT", "TraceError", "TraceHeader", "TraceReader", "TraceRecord", "read_trace",
           "write_trace"]
