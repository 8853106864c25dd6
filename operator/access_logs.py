"""Fetch the node agents' sampled access logs (anchorage-trace/v1) for tuning.

Each entry of ``spec.tuning.accessLogs`` is a file path readable by the operator (e.g. a
mounted volume) or an http(s) URL of a node agent's access-log endpoint. Records from all
sources are merged by timestamp and the most recent ``max_requests`` kept.

A node agent serves its access log only behind the operator's token (it holds every
sampled tenant's sessions and tool arguments): each URL is fetched with ``Authorization:
Bearer <token>``, the token from ``ANCHORAGE_ACCESS_LOG_TOKEN`` (the chart's Secret).
Reading never empties a node agent's buffer (draining is a POST this module never sends).
"""

from __future__ import annotations

import os
import tempfile

import httpx

from anchorage.trace.format import TraceError, TraceRecord, read_trace


class AccessLogError(RuntimeError):
    pass


def _read(path: str) -> list[TraceRecord]:
    try:
        return read_trace(path)[1]
    except TraceError as e:
        raise AccessLogError(str(e)) from None
    except OSError as e:
        raise AccessLogError(f"cannot read access log {path}: {e.strerror or e}") from None


ENV_TOKEN = "ANCHORAGE_ACCESS_LOG_TOKEN"


def load_access_logs(sources: list[str], *, max_requests: int, timeout_s: float = 30.0,
                     token: str | None = None) -> list[TraceRecord]:
    """``token``: the node agents' access-log token (None: ``ANCHORAGE_ACCESS_LOG_TOKEN``)."""
    token = (os.environ.get(ENV_TOKEN, "") if token is None else token).strip()
    headers = {"authorization": f"Bearer {token}"} if token else {}
    records: list[TraceRecord] = []
    for src in sources:
        if src.startswith(("http://", "https://")):
            try:
                resp = httpx.get(src, timeout=timeout_s, headers=headers)
                resp.raise_for_status()
            except httpx.HTTPError as e:
                raise AccessLogError(f"cannot fetch access log {src}: {e}") from None
            suffix = ".jsonl.gz" if resp.content[:2] == b"\x1f\x8b" else ".jsonl"
            with tempfile.NamedTemporaryFile("wb", suffix=suffix, delete=False) as fh:
                fh.write(resp.content)
            try:
                records += _read(fh.name)
            finally:
                os.unlink(fh.name)
        else:
            records += _read(src)
    records.sort(key=lambda r: r.timestamp)
    return records[-max_requests:]
