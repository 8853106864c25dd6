"""The kubelet's and the Job controller's part for Helm's hook Jobs on a test API server
without nodes: while `helm install` / `helm upgrade` waits on a hook Job, run the Job's
container command here, as its ServiceAccount (a TokenRequest token, so the API server
applies exactly the hook's RBAC), with its ConfigMap volumes written out as files at their
mount paths' stand-ins, then mark the Job Complete (or Failed) as the Job controller would.
Each run is recorded (``runs``: Job name, exit status, output)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path


class HookKubelet:
    def __init__(self, cluster, api, namespace: str, workdir: Path, timeout_s: float = 120):
        self.cluster, self.api, self.ns, self.workdir = cluster, api, namespace, workdir
        self.timeout_s = timeout_s
        self.runs: list[dict] = []
        self._done: set[str] = set()          # Job uids already run
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "HookKubelet":
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        from kubernetes import client

        batch = client.BatchV1Api(self.api)
        while not self._stop.is_set():
            try:
                jobs = batch.list_namespaced_job(self.ns).items
            except Exception:  # noqa: BLE001 - the namespace may not exist yet
                jobs = []
            for job in jobs:
                ann = job.metadata.annotations or {}
                if "helm.sh/hook" in ann and job.metadata.uid not in self._done \
                        and not (job.status and (job.status.succeeded or job.status.failed)):
                    self._done.add(job.metadata.uid)
                    self._run(batch, job)
            self._stop.wait(0.3)

    def _run(self, batch, job) -> None:
        from kubernetes import client

        spec = job.spec.template.spec
        (c,) = spec.containers
        work = self.workdir / f"{job.metadata.name}-{len(self.runs)}"
        work.mkdir(parents=True)
        core = client.CoreV1Api(self.api)
        mounts = {}
        for v in spec.volumes or []:
            if v.config_map:
                d = work / v.name
                d.mkdir()
                cm = core.read_namespaced_config_map(v.config_map.name, self.ns)
                for k, text in (cm.data or {}).items():
                    (d / k).write_text(text)
                mounts[v.name] = str(d)
        args = list(c.args or [])
        for m in c.volume_mounts or []:
            if m.name in mounts:
                args = [a.replace(m.mount_path, mounts[m.name]) for a in args]
        kubeconfig = self.cluster.service_account_kubeconfig(
            self.api, self.ns, spec.service_account_name, work / "kubeconfig")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = str(kubeconfig)
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "anchorage", *args], env=env,
                           capture_output=True, text=True, timeout=self.timeout_s)
        self.runs.append({"job": job.metadata.name, "rc": r.returncode,
                          "output": r.stdout + r.stderr, "args": args})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ok = r.returncode == 0
        cond = {"type": "Complete" if ok else "Failed", "status": "True",
                "lastProbeTime": now, "lastTransitionTime": now,
                **({} if ok else {"reason": "BackoffLimitExceeded", "message": r.stderr[-500:]})}
        status = {"conditions": [cond], "startTime": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "succeeded" if ok else "failed": 1}
        if ok:
            status["completionTime"] = now
        batch.patch_namespaced_job_status(job.metadata.name, self.ns, {"status": status})
