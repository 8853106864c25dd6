"""Runs inside a private network namespace (started by ``conftest.netns``): executes
functions of ``tests.router.ops`` on request over a Unix socket (filesystem sockets
cross network namespaces; TCP on this namespace's loopback is reachable only from here).
"""

from __future__ import annotations

import sys
import traceback
from multiprocessing.connection import Listener


def main(path: str) -> None:
    from tests.router import ops

    with Listener(path, family="AF_UNIX", authkey=b"anchorage-router-tests") as ln:
        with ln.accept() as conn:
            while True:
                try:
                    msg = conn.recv()
                except EOFError:
                    break
                if msg is None:
                    break
                fn, args, kwargs = msg
                try:
                    conn.send(("ok", getattr(ops, fn)(*args, **kwargs)))
                except Exception:  # noqa: BLE001 - reported to the test
                    conn.send(("err", traceback.format_exc()))
    ops.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
