"""A real Kubernetes 1.20 control plane on loopback: etcd, kube-apiserver and (optionally)
kube-controller-manager, for integration tests.

Binaries: ``etcd`` on PATH (apt etcd-server); kube-apiserver and kube-controller-manager from
``scripts/k8s/build.sh``'s cache (``$ANCHORAGE_K8S_CACHE``, default
``~/.cache/anchorage/k8s-1.20``)/bin. Authentication is one static admin token; the
kubeconfig skips TLS verification of the self-signed serving certificate.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import free_port, spawn, stop, wait_until

CACHE = Path(os.environ.get("ANCHORAGE_K8S_CACHE",
                            Path.home() / ".cache" / "anchorage" / "k8s-1.20"))
BUILD_HINT = "run `bash scripts/k8s/build.sh` (apt etcd-server + a ~5 min build, cached)"


def binaries() -> dict[str, str | None]:
    b = CACHE / "bin"
    return {
        "etcd": shutil.which("etcd"),
        "kube-apiserver": str(b / "kube-apiserver") if (b / "kube-apiserver").exists() else None,
        "kube-controller-manager": (str(b / "kube-controller-manager")
                                    if (b / "kube-controller-manager").exists() else None),
    }


def missing() -> list[str]:
    return [k for k, v in binaries().items() if v is None]


@dataclass
class LocalCluster:
    workdir: Path
    controller_manager: bool = True
    # kube-controller-manager --controllers (no job controller: tests play its part for
    # Helm's hook Jobs, tests/support/hooks.py)
    controllers: str = "garbagecollector,deployment,replicaset,statefulset"
    token: str = "anchorage-test-admin-token"
    server: str = ""
    kubeconfig: Path = field(init=False)
    _procs: list[subprocess.Popen] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.kubeconfig = self.workdir / "kubeconfig"

    def _ready(self, path: str) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(self.server + path,
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
            return r.status == 200

    def start(self) -> "LocalCluster":
        bins = binaries()
        w = self.workdir
        w.mkdir(parents=True, exist_ok=True)
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd = spawn([bins["etcd"], "--name", "test", "--data-dir", str(w / "etcd"),
                      "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                      "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                      "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                      "--initial-cluster", f"test=http://127.0.0.1:{peer_port}",
                      "--listen-metrics-urls", f"http://127.0.0.1:{free_port()}"],
                     w / "etcd.log")
        self._procs.append(etcd)
        wait_until(lambda: urllib.request.urlopen(etcd_url + "/health", timeout=2).status == 200,
                   "etcd", 30, etcd, w / "etcd.log")
        subprocess.run(["openssl", "genrsa", "-out", str(w / "sa.key"), "2048"], check=True,
                       capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(w / "sa.key"), "-pubout", "-out",
                        str(w / "sa.pub")], check=True, capture_output=True)
        (w / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        self.server = f"https://127.0.0.1:{api_port}"
        api = spawn([bins["kube-apiserver"], f"--etcd-servers={etcd_url}",
                     "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                     f"--secure-port={api_port}", "--insecure-port=0",
                     f"--cert-dir={w / 'certs'}", f"--token-auth-file={w / 'tokens.csv'}",
                     "--authorization-mode=RBAC",
                     "--service-account-issuer=https://kubernetes.default.svc",
                     f"--service-account-key-file={w / 'sa.pub'}",
                     f"--service-account-signing-key-file={w / 'sa.key'}",
                     "--service-cluster-ip-range=10.96.0.0/24",
                     "--enable-priority-and-fairness=false", "--endpoint-reconciler-type=none",
                     "--disable-admission-plugins=ServiceAccount",
                     # as clusters that check who may block an owner's deletion do
                     "--enable-admission-plugins=OwnerReferencesPermissionEnforcement"],
                    w / "kube-apiserver.log")
        self._procs.append(api)
        wait_until(lambda: self._ready("/readyz"), "kube-apiserver", 90, api,
                   w / "kube-apiserver.log")
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: test, cluster: {{server: '{self.server}', "
            "insecure-skip-tls-verify: true}}]\n"
            f"users: [{{name: admin, user: {{token: {self.token}}}}}]\n"
            "contexts: [{name: test, context: {cluster: test, user: admin, namespace: default}}]\n"
            "current-context: test\n")
        if self.controller_manager:
            cm = spawn([bins["kube-controller-manager"], f"--kubeconfig={self.kubeconfig}",
                        f"--controllers={self.controllers}",
                        "--leader-elect=false", "--port=0", "--secure-port=0",
                        f"--service-account-private-key-file={w / 'sa.key'}"],
                       w / "kube-controller-manager.log")
            self._procs.append(cm)
        return self

    def service_account_kubeconfig(self, api, namespace: str, name: str, path: Path) -> Path:
        """A kubeconfig authenticating as ServiceAccount ``namespace/name``: a real token
        from the API server's TokenRequest API (signed with the cluster's key, so the
        apiserver authenticates it as ``system:serviceaccount:NS:NAME`` with its groups)."""
        from kubernetes import client

        req = client.CoreV1Api(api).create_namespaced_service_account_token(
            name, namespace, {"spec": {"audiences": ["https://kubernetes.default.svc"],
                                       "expirationSeconds": 7200}})
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: test, cluster: {{server: '{self.server}', "
            "insecure-skip-tls-verify: true}}]\n"
            f"users: [{{name: {name}, user: {{token: {req.status.token}}}}}]\n"
            f"contexts: [{{name: sa, context: {{cluster: test, user: {name}, "
            f"namespace: {namespace}}}}}]\ncurrent-context: sa\n")
        return path

    def stop(self) -> None:
        for p in reversed(self._procs):
            stop(p)
        self._procs.clear()
