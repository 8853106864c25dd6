#!/usr/bin/env python3
"""A real single-node Kubernetes 1.20 cluster inside a network namespace: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, kubelet (dockershim), kube-proxy
(iptables) and dockerd with its own roots and socket, every one started with
``nsenter --net=<namespace>``; the images of scripts/cluster/images.py loaded into dockerd.
``down`` stops everything by recorded PID and removes what the node created (mounts,
cgroups, host paths that did not exist before, the namespace), so the host is left as found
(tests/cluster/ checks it with netns.snapshot()/diff()). ENVIRONMENT.md, "A real
single-node cluster with running pods", explains the flags.

    python scripts/cluster/node.py up --workdir DIR     # prints the cluster's JSON
    python scripts/cluster/node.py down --workdir DIR

Binaries: scripts/k8s/build.sh's cache (all five), etcd (apt etcd-server), Debian's
docker.io (/usr/sbin/dockerd, /usr/bin/docker). dockerd's data root is kept in
``~/.cache/anchorage/cluster/docker`` (``ANCHORAGE_CLUSTER_CACHE``) so loaded images survive
between runs; one cluster at a time uses it (a lock file). Root only.

Over ~400 lines on purpose: bring-up and teardown of the same daemons, paths and mounts
read side by side (what ``up`` creates, ``down`` must remove).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns  # noqa: E402

K8S_BIN = Path(os.environ.get("ANCHORAGE_K8S_CACHE",
                              Path.home() / ".cache" / "anchorage" / "k8s-1.20")) / "bin"
CLUSTER_CACHE = Path(os.environ.get("ANCHORAGE_CLUSTER_CACHE",
                                    Path.home() / ".cache" / "anchorage" / "cluster"))
NODE = "anchorage-node"
API_PORT = 6443
ADMIN_TOKEN = "anchorage-cluster-admin"
KUBELET_TOKEN = "anchorage-cluster-kubelet"
DOCKER = "/usr/bin/docker"     # Debian's client (matches dockerd 20.10)
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")


def missing() -> list[str]:
    """What the node needs and this machine lacks, each with how to get it."""
    out = [f"{b} ({K8S_BIN}; bash scripts/k8s/build.sh)" for b in BINARIES
           if not (K8S_BIN / b).exists()]
    for tool, how in (("etcd", "apt etcd-server (scripts/k8s/build.sh)"),
                      ("dockerd", "apt docker.io (scripts/cluster/deps.sh)"),
                      ("debootstrap", "apt debootstrap (scripts/cluster/deps.sh)"),
                      ("nsenter", "util-linux"), ("unshare", "util-linux"),
                      ("iptables", "apt iptables"), ("openssl", "apt openssl")):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            out.append(f"{tool} ({how})")
    if not Path(DOCKER).exists():
        out.append(f"{DOCKER} (apt docker.io)")
    if os.geteuid() != 0:
        out.append("root (network namespaces, dockerd, kubelet)")
    return out


class Node:
    """One cluster; every path it owns is under ``workdir`` except the docker data root."""

    def __init__(self, workdir: Path, cgroup_name: str | None = None) -> None:
        self.w = Path(workdir).resolve()
        self.state_file = self.w / "state.json"
        self.state: dict = (json.loads(self.state_file.read_text()) if self.state_file.exists()
                            else {"procs": [], "cgroup": cgroup_name or f"anchorage-{os.getpid()}"})
        self.ns = str(self.w / "netns")
        self.kubeconfig = self.w / "admin.kubeconfig"
        self.server = f"https://{netns.NODE_IP}:{API_PORT}"
        self.docker_sock = self.w / "docker.sock"
        self._lock = None

    @property
    def docker(self) -> list[str]:
        return ["nsenter", f"--net={self.ns}", "--", DOCKER, "-H", f"unix://{self.docker_sock}"]

    def _save(self) -> None:
        self.state_file.write_text(json.dumps(self.state, indent=1))

    # --- processes --------------------------------------------------------------------
    def spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.w / "logs" / f"{name}.log", "ab")
        p = subprocess.Popen(["nsenter", f"--net={self.ns}", "--", *argv], stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        log.close()
        self.state["procs"].append({"name": name, "pid": p.pid, "start": _start_time(p.pid)})
        self._save()

    def wait(self, what: str, pred, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if pred():
                    return
            except Exception:
                pass
            dead = [p["name"] for p in self.state["procs"] if not _alive(p)]
            if dead:
                break
            time.sleep(0.5)
        name = what.split()[0]
        log = self.w / "logs" / f"{name}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:]) if log.exists() else ""
        raise RuntimeError(f"{what} not ready in {timeout_s:.0f} s"
                           + (f" ({', '.join(dead)} exited)" if dead else "") + f"; {log}:\n{tail}")

    def api_get(self, path: str) -> dict:
        ctx = ssl.create_default_context(cafile=str(self.w / "pki" / "ca.crt"))
        req = urllib.request.Request(self.server + path,
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with _in_netns(self.ns):
            with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                return json.loads(r.read() or b"{}") if r.headers.get_content_type() == "application/json" else {"ok": r.status}

    # --- bring-up ---------------------------------------------------------------------
    def up(self, load_images: bool = True) -> dict:
        gone = missing()
        if gone:
            raise RuntimeError("missing: " + "; ".join(gone))
        for d in ("logs", "pki", "etcd", "kubelet", "dockershim", "docker-exec", "volume-plugins"):
            (self.w / d).mkdir(parents=True, exist_ok=True)
        CLUSTER_CACHE.mkdir(parents=True, exist_ok=True)
        self._lock = open(CLUSTER_CACHE / "lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another test cluster holds {CLUSTER_CACHE / 'lock'}") from None
        self.state["host_before"] = netns.snapshot()["paths"]
        self._save()
        self._pki()
        netns.create(Path(self.ns))
        self.state["netns"] = self.ns
        self._cgroups_create()
        self._save()
        t0 = time.monotonic()
        self._control_plane()
        self._dockerd()
        images = []
        if load_images:
            import images as imgs
            images = imgs.load(self.docker)
        self._node_daemons()
        return {"kubeconfig": str(self.kubeconfig), "server": self.server,
                "netns": self.ns, "node_ip": netns.NODE_IP, "node": NODE,
                "token": ADMIN_TOKEN, "ca": str(self.w / "pki" / "ca.crt"),
                "docker": self.docker, "images": images,
                "up_seconds": round(time.monotonic() - t0, 1)}

    def _pki(self) -> None:
        pki = self.w / "pki"
        if (pki / "ca.crt").exists():
            return
        ssl_ = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
        ssl_("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=anchorage-test-ca", "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"))
        ext = pki / "san.ext"
        ext.write_text(f"subjectAltName=IP:{netns.NODE_IP},IP:10.96.0.1,IP:127.0.0.1,"
                       "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
                       "DNS:kubernetes.default.svc.cluster.local\n")
        for name, cn, extfile in (("apiserver", "kube-apiserver", ext),
                                  ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", None),
                                  ("kubelet", NODE, ext)):
            ssl_("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                 "-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.csr"))
            ssl_("x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.crt"),
                 "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "2",
                 "-out", str(pki / f"{name}.crt"), *(["-extfile", str(extfile)] if extfile else []))
        ssl_("genrsa", "-out", str(pki / "sa.key"), "2048")
        ssl_("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
        (pki / "tokens.csv").write_text(
            f"{ADMIN_TOKEN},admin,admin,system:masters\n"
            f"{KUBELET_TOKEN},system:node:{NODE},kubelet,system:nodes\n")
        for name, token in (("admin", ADMIN_TOKEN), ("kubelet", KUBELET_TOKEN)):
            (self.w / f"{name}.kubeconfig").write_text(
                "apiVersion: v1\nkind: Config\n"
                f"clusters: [{{name: c, cluster: {{server: '{self.server}', "
                f"certificate-authority: '{pki / 'ca.crt'}'}}}}]\n"
                f"users: [{{name: u, user: {{token: {token}}}}}]\n"
                "contexts: [{name: c, context: {cluster: c, user: u, namespace: default}}]\n"
                "current-context: c\n")
        (self.w / "resolv.conf").write_text("nameserver 127.0.0.1\n")

    def _control_plane(self) -> None:
        b, pki = K8S_BIN, self.w / "pki"
        self.spawn("etcd", [shutil.which("etcd"), "--name", "node", "--data-dir", str(self.w / "etcd"),
                            "--listen-client-urls", "http://127.0.0.1:2379",
                            "--advertise-client-urls", "http://127.0.0.1:2379",
                            "--listen-peer-urls", "http://127.0.0.1:2380",
                            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                            "--initial-cluster", "node=http://127.0.0.1:2380",
                            "--listen-metrics-urls", "http://127.0.0.1:2381"])
        self.spawn("kube-apiserver", [
            str(b / "kube-apiserver"), "--etcd-servers=http://127.0.0.1:2379",
            f"--bind-address={netns.NODE_IP}", f"--advertise-address={netns.NODE_IP}",
            f"--secure-port={API_PORT}", "--insecure-port=0",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={netns.SERVICE_RANGE}",
            "--enable-priority-and-fairness=false",
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}"])
        self.wait("etcd", self._etcd_ok, 60)
        self.wait("kube-apiserver /readyz", lambda: self.api_get("/readyz"), 120)
        kc = str(self.kubeconfig)
        self.spawn("kube-controller-manager", [
            str(b / "kube-controller-manager"), f"--kubeconfig={kc}", "--leader-elect=false",
            "--port=0", "--bind-address=127.0.0.1", "--use-service-account-credentials=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", "--node-monitor-grace-period=40s",
            "--controllers=*,-nodeipam,-csrsigning,-csrapproving,-tokencleaner,-bootstrapsigner,-cloud-node-lifecycle,-route,-service"])
        self.spawn("kube-scheduler", [str(b / "kube-scheduler"), f"--kubeconfig={kc}",
                                      "--leader-elect=false", "--port=0",
                                      "--bind-address=127.0.0.1"])

    def _etcd_ok(self) -> bool:
        with _in_netns(self.ns):
            with urllib.request.urlopen("http://127.0.0.1:2379/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"

    def _dockerd(self) -> None:
        data = CLUSTER_CACHE / "docker"
        data.mkdir(parents=True, exist_ok=True)
        self.spawn("dockerd", [
            "/usr/sbin/dockerd", f"--data-root={data}", f"--exec-root={self.w / 'docker-exec'}",
            "-H", f"unix://{self.docker_sock}", f"--pidfile={self.w / 'docker.pid'}",
            "--storage-driver=overlay2", "--exec-opt", "native.cgroupdriver=cgroupfs",
            f"--cgroup-parent=/{self.state['cgroup']}/docker", f"--bip={netns.POD_BRIDGE}",
            "--userland-proxy=false", "--iptables=true", "--ip-masq=true",
            f"--oom-score-adjust={_own_oom_score_adj()}", "--log-driver=json-file",
            "--log-opt", "max-size=20m", "--live-restore=false", "--no-new-privileges=false"])
        self.wait("dockerd", lambda: subprocess.run([*self.docker, "info"], capture_output=True,
                                                    timeout=10).returncode == 0, 90)
        # Containers a crashed earlier run left behind in the shared data root.
        ids = subprocess.run([*self.docker, "ps", "-aq"], capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run([*self.docker, "rm", "-f", *ids], capture_output=True)

    def _node_daemons(self) -> None:
        b, pki, own = K8S_BIN, self.w / "pki", str(_own_oom_score_adj())
        self.spawn("kubelet", [
            str(b / "kubelet"), f"--kubeconfig={self.w / 'kubelet.kubeconfig'}",
            "--container-runtime=docker", f"--docker-endpoint=unix://{self.docker_sock}",
            f"--root-dir={self.w / 'kubelet'}",
            f"--experimental-dockershim-root-directory={self.w / 'dockershim'}",
            f"--volume-plugin-dir={self.w / 'volume-plugins'}",
            "--pod-infra-container-image=anchorage.local/pause:3.2",
            "--fail-swap-on=false", "--cgroup-driver=cgroupfs",
            f"--cgroup-root=/{self.state['cgroup']}", f"--node-ip={netns.NODE_IP}",
            f"--address={netns.NODE_IP}", f"--hostname-override={NODE}", "--read-only-port=0",
            f"--resolv-conf={self.w / 'resolv.conf'}", f"--oom-score-adj={own}",
            "--image-gc-high-threshold=100", "--image-gc-low-threshold=99",
            "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%",
            "--anonymous-auth=false", f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=AlwaysAllow", f"--tls-cert-file={pki / 'kubelet.crt'}",
            f"--tls-private-key-file={pki / 'kubelet.key'}", "--sync-frequency=10s",
            "--serialize-image-pulls=false", "--max-pods=30", "--healthz-port=0"])
        self.spawn("kube-proxy", [
            str(b / "kube-proxy"), f"--kubeconfig={self.kubeconfig}", "--proxy-mode=iptables",
            f"--hostname-override={NODE}", f"--bind-address={netns.NODE_IP}",
            "--cluster-cidr=10.98.0.0/24", "--masquerade-all=true",
            "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0", f"--oom-score-adj={own}",
            "--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256"])
        self.wait("kubelet (node Ready)", self._node_ready, 180)
        self.wait("kube-proxy rules", lambda: "KUBE-SERVICES" in netns.run(
            "iptables-save", "-t", "nat", netns=self.ns), 60)
        self.wait("kube-controller-manager (default ServiceAccount token)", lambda: any(
            s["metadata"]["name"].startswith("default-token") for s in
            self.api_get("/api/v1/namespaces/default/secrets")["items"]), 90)

    def _node_ready(self) -> bool:
        node = self.api_get(f"/api/v1/nodes/{NODE}")
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in node.get("status", {}).get("conditions", []))

    def _cgroups_create(self) -> None:
        root = Path("/sys/fs/cgroup")
        for ctrl in root.iterdir():
            d = ctrl / self.state["cgroup"]
            if not (ctrl / "cgroup.procs").exists() or d.exists():
                continue
            d.mkdir()
            for f in ("cpuset.cpus", "cpuset.mems"):   # a v1 cpuset child starts empty
                if (ctrl / f).exists():
                    (d / f).write_text((ctrl / f).read_text())
            # A cgroup weighs as much as one task of the root: give the node's pods the
            # weight of as many tasks as the machine has CPUs (ANCHORAGE_CLUSTER_CPU_SHARES
            # to change it), so a busy host does not starve them into failed probes.
            if (d / "cpu.shares").exists():
                shares = os.environ.get("ANCHORAGE_CLUSTER_CPU_SHARES") or 1024 * (os.cpu_count() or 1)
                (d / "cpu.shares").write_text(str(int(shares)))

    # --- teardown ---------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop and remove everything; returns what could not be removed (empty: clean)."""
        problems: list[str] = []
        procs = {p["name"]: p for p in self.state.get("procs", [])}
        for name in ("kubelet", "kube-proxy"):
            if name in procs:
                _stop(procs[name])
        if "dockerd" in procs and _alive(procs["dockerd"]):
            ids = subprocess.run([*self.docker, "ps", "-aq"], capture_output=True,
                                 text=True, timeout=60).stdout.split()
            if ids:
                subprocess.run([*self.docker, "rm", "-f", *ids], capture_output=True, timeout=180)
        for name in ("dockerd", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            if name in procs:
                _stop(procs[name], 30 if name == "dockerd" else 10)
        for pid in netns.pids_in(self.ns):      # containerd shims, anything else left inside
            _kill(pid)
        self._cgroups_remove(problems)
        self._umount_below(problems)
        netns.delete(Path(self.ns))
        self._host_paths(problems)
        if self._lock is not None:
            self._lock.close()
        self.state["procs"] = []
        self._save()
        return problems

    def _umount_below(self, problems: list[str]) -> None:
        roots = (str(self.w) + "/", str(CLUSTER_CACHE / "docker") + "/")
        for _ in range(3):
            mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
            mine = [m for m in mounts if m.startswith(roots) and m != self.ns]
            if not mine:
                return
            for m in sorted(mine, key=len, reverse=True):
                subprocess.run(["umount", "-l", m], capture_output=True)
        problems += [f"mount left: {m}" for m in mine]

    def _cgroups_remove(self, problems: list[str]) -> None:
        for ctrl in Path("/sys/fs/cgroup").iterdir():
            top = ctrl / self.state["cgroup"]
            if not top.is_dir():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                          reverse=True) + [top]
            for d in dirs:
                for attempt in range(20):
                    try:
                        for pid in (d / "cgroup.procs").read_text().split():
                            _kill(int(pid))
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.25)
                else:
                    problems.append(f"cgroup left: {d}")

    def _host_paths(self, problems: list[str]) -> None:
        before = self.state.get("host_before", {})
        for path, listing in before.items():
            p = Path(path)
            if listing is None:            # created by this node: remove it whole
                if p.is_symlink() or p.is_file():
                    p.unlink()
                elif p.exists():
                    shutil.rmtree(p, ignore_errors=True)
            elif p.is_dir():               # existed: remove the entries this node added
                for child in p.iterdir():
                    if child.name not in listing:
                        if child.is_dir() and not child.is_symlink():
                            shutil.rmtree(child, ignore_errors=True)
                        else:
                            child.unlink()
            if (listing is None and p.exists()) or (listing is not None and p.is_dir()
                                                     and set(c.name for c in p.iterdir()) - set(listing)):
                problems.append(f"host path left: {path}")


class _in_netns:
    """Run the calling thread in the namespace bound at ``path`` (setns), then return."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self):
        import ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.orig = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if self.libc.setns(fd, 0x40000000) != 0:   # CLONE_NEWNET
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)
        return self

    def __exit__(self, *exc):
        self.libc.setns(self.orig, 0x40000000)
        os.close(self.orig)


in_netns = _in_netns


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return ""


def _alive(p: dict) -> bool:
    return _start_time(p["pid"]) == p["start"] and p["start"] != ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _stop(p: dict, timeout_s: float = 10.0) -> None:
    """SIGTERM the recorded process (only if its PID was not reused), SIGKILL after a while."""
    if not _alive(p):
        return
    os.kill(p["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(p):
        try:
            os.waitpid(p["pid"], os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.2)
    if _alive(p):
        _kill(p["pid"])
        time.sleep(0.2)
    try:
        os.waitpid(p["pid"], os.WNOHANG)
    except ChildProcessError:
        pass


def _own_oom_score_adj() -> int:
    return int(Path("/proc/self/oom_score_adj").read_text().strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["up", "down", "missing"])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/anchorage-cluster"))
    ap.add_argument("--no-images", action="store_true", help="do not load the images")
    args = ap.parse_args(argv)
    if args.cmd == "missing":
        print("\n".join(missing()))
        return 1 if missing() else 0
    node = Node(args.workdir)
    if args.cmd == "up":
        args.workdir.mkdir(parents=True, exist_ok=True)
        try:
            print(json.dumps(node.up(load_images=not args.no_images), indent=1))
        except Exception as exc:
            print(f"node: {exc}", file=sys.stderr)
            node.down()
            return 1
        return 0
    problems = node.down()
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
