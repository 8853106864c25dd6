"""Router test fixtures: one real local Ray (with Serve) per test session, started inside a
private network namespace (``unshare -n`` + ``ip link set lo up``, HOME in a temp dir),
driven over a Unix socket. Tests never touch an address outside that namespace."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from multiprocessing.connection import Client
from pathlib import Path

import pytest

from tests.conftest import REPO, need


class Netns:
    def __init__(self, tmp: Path) -> None:
        self.sock = str(tmp / "worker.sock")
        env = dict(os.environ, HOME=str(tmp / "home"),
                   RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_USAGE_STATS="1")
        (tmp / "home").mkdir()
        self.log = open(tmp / "worker.log", "w")
        self.proc = subprocess.Popen(
            ["unshare", "-n", "--", "sh", "-c",
             f'ip link set lo up && exec "{sys.executable}" -m tests.router.netns_worker "{self.sock}"'],
            cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.logpath = tmp / "worker.log"
        deadline = time.time() + 60
        while True:
            try:
                self.conn = Client(self.sock, family="AF_UNIX", authkey=b"anchorage-router-tests")
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("netns worker did not start:\n" + self.logpath.read_text()[-3000:])
                time.sleep(0.1)

    def __call__(self, fn: str, *args, **kwargs):
        self.conn.send((fn, args, kwargs))
        status, value = self.conn.recv()
        if status != "ok":
            raise AssertionError(f"{fn} failed in the netns worker:\n{value}")
        return value

    def close(self) -> None:
        try:
            self.conn.send(None)
            self.proc.wait(60)
        except Exception:  # noqa: BLE001
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def netns(tmp_path_factory):
    need(importlib.util.find_spec("ray") is not None, "ray[serve]==2.60.0",
         "pip install 'anchorage[router]'")
    need(os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("ip") is not None,
         "root with unshare and ip (private network namespace for Ray)",
         "run the router tests as root (CI containers are)")
    ns = Netns(tmp_path_factory.mktemp("router-netns"))
    yield ns
    ns.close()


@pytest.fixture(scope="session")
def cluster(netns):
    """Three fake upstreams and Ray + Serve, once per session."""
    urls = netns("start_upstreams", 3)
    netns("start_ray")
    return {"ns": netns, "urls": urls, "names": netns("upstream_names")}
