"""Serve's HAProxy ingress, as a router started on this machine runs it: the config Ray
Serve 2.60 generates (``serve/_private/haproxy_templates.py``) rewritten before HAProxy
reads it, by a wrapper Serve runs as its HAProxy binary (``RAY_SERVE_HAPROXY_BINARY_PATH``,
written by ``app.loopback_haproxy``). Standard library only: the wrapper runs this file
with ``python -I -S`` on every HAProxy start and reload.

``rewrite(text, error_dir, http_request_timeout_s)``:

- **Every error HAProxy itself answers is an OpenAI error object.** HAProxy answers some
  requests before any router replica sees them: a header block larger than its buffer
  (16 KiB: a 100 KB session id, a 1 MB header), a malformed request (a negative
  Content-Length), headers that do not arrive in time, no replica up (Serve's template
  maps 502/503/504 to a ``text/plain`` 500), and its ``http-request return`` answers
  (Serve's ``/-/healthz`` 503, the 404 of a path no app serves). Each status HAProxy
  can answer from a file (``errorfile``: 400, 403, 404, 405, 408, 410, 413, 425, 429,
  500-504) gets a JSON file in ``error_dir`` (``write_error_files``), set in
  ``defaults`` in place of Serve's; every ``http-request return`` of status >= 400 with a
  ``text/plain`` body answers the same object as JSON.
- **Headers within ``http_request_timeout_s``** (``timeout http-request`` in
  ``defaults``, unless the template set one): a client that stops sending its headers
  gets the 408 object. Only the headers: the body streams through to the router, whose
  ``body_timeout_s`` bounds it (HAProxy applies this timeout to the body only with
  ``option http-buffer-request``, which Serve does not set).
- **No stats page and no Prometheus listener.** Serve's template binds HAProxy's stats
  page (no authentication) on ``*:8404`` and its Prometheus exporter on ``:9101``, fixed
  ports on every interface: two stacks on one machine clash on them, and anyone who can
  reach the node reads the stats. Nothing of Serve's reads them over TCP (its
  HAProxyManager uses the admin socket and the metrics log socket), and the router
  exports its own metrics: both sections are removed.
- The client-facing frontend binds the Serve HTTP host as configured (``--host=0.0.0.0``
  in the chart's router pod, reached through its Service).
"""

from __future__ import annotations

import json
import os
import re
import sys

ERRORFILE_STATUSES = {
    400: ("Bad Request", "the request is malformed or its headers are too large "
                         "(refused by the ingress)", "invalid_request_error", "bad_request"),
    403: ("Forbidden", "forbidden", "permission_error", "forbidden"),
    404: ("Not Found", "no such endpoint", "invalid_request_error", "not_found"),
    405: ("Method Not Allowed", "method not allowed", "invalid_request_error",
          "method_not_allowed"),
    408: ("Request Timeout", "the request was not received in time", "invalid_request_error",
          "request_timeout"),
    410: ("Gone", "gone", "invalid_request_error", "gone"),
    413: ("Payload Too Large", "the request is too large", "invalid_request_error",
          "request_too_large"),
    425: ("Too Early", "too early", "invalid_request_error", "too_early"),
    429: ("Too Many Requests", "too many requests; retry later", "rate_limit_error",
          "rate_limited"),
    500: ("Internal Server Error", "internal ingress error", "internal_error", "internal_error"),
    501: ("Not Implemented", "not implemented by the ingress", "invalid_request_error",
          "not_implemented"),
    502: ("Bad Gateway", "the router failed while answering", "service_unavailable",
          "bad_gateway"),
    503: ("Service Unavailable", "no router replica is available; retry later",
          "service_unavailable", "service_unavailable"),
    504: ("Gateway Timeout", "the router did not answer in time", "timeout",
          "gateway_timeout"),
}
REMOVED_SECTIONS = ("frontend prometheus", "listen stats")


def error_json(status: int, message: str | None = None) -> str:
    _, msg, type_, code = ERRORFILE_STATUSES.get(
        status, ("", "request refused by the ingress", "invalid_request_error", str(status)))
    return json.dumps({"error": {"message": message or msg, "type": type_, "param": None,
                                 "code": code}})


def write_error_files(error_dir: str) -> dict[int, str]:
    """One raw HTTP response per status (HAProxy's ``errorfile`` format); status -> path."""
    os.makedirs(error_dir, exist_ok=True)
    out = {}
    for status, (reason, *_rest) in ERRORFILE_STATUSES.items():
        body = error_json(status).encode()
        path = os.path.join(error_dir, f"{status}.http")
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nCache-Control: no-cache\r\n"
                "Connection: close\r\n\r\n").encode()
        with open(path + ".tmp", "wb") as f:
            f.write(head + body)
        os.replace(path + ".tmp", path)
        out[status] = path
    return out


_RETURN = re.compile(r'^(\s*http-request return status )(\d+)( content-type )text/plain '
                     r'(?:lf-)?string (".*?(?<!\\)")(.*)$')


def _json_return(m: re.Match) -> str:
    status = int(m.group(2))
    if status < 400:
        return m.group(0)
    body = error_json(status).replace("\\", "\\\\").replace('"', '\\"')
    return f'{m.group(1)}{status}{m.group(3)}application/json string "{body}"{m.group(5)}'


def rewrite(text: str, error_files: dict[int, str], http_request_timeout_s: float) -> str:
    out: list[str] = []
    skipping = False
    section = ""
    has_http_request_timeout = re.search(r"^\s*timeout http-request\s", text, re.M) is not None
    for line in text.splitlines():
        top = bool(line) and not line[0].isspace() and not line.startswith("#")
        if top:
            section = line.strip()
            skipping = any(section == s or section.startswith(s + " ")
                           for s in REMOVED_SECTIONS)
            if skipping:
                continue
        elif skipping:
            continue
        if section == "defaults" and re.match(r"^\s*errorfile\s", line):
            continue                     # Serve's text/plain 500 for 502-504: ours below
        m = _RETURN.match(line)
        out.append(_json_return(m) if m else line)
        if top and section == "defaults":
            out.extend(f"    errorfile {s} {p}" for s, p in sorted(error_files.items()))
            if not has_http_request_timeout:
                out.append(f"    timeout http-request {max(1, round(http_request_timeout_s))}s")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> None:
    """``ingress.py REAL_HAPROXY ERROR_DIR TIMEOUT_S HAPROXY_ARGS...``: rewrite the file
    after ``-f`` in place, then exec HAProxy on the same arguments."""
    real, error_dir, timeout_s, args = argv[0], argv[1], float(argv[2]), argv[3:]
    files = write_error_files(error_dir)
    for flag, path in zip(args, args[1:]):
        if flag == "-f" and os.path.isfile(path):
            with open(path) as f:
                text = f.read()
            new = rewrite(text, files, timeout_s)
            with open(path + ".anchorage", "w") as f:
                f.write(new)
            os.replace(path + ".anchorage", path)
    os.execv(real, [real, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
