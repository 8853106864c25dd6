"""A first install fails loudly or works (issue 41, section 2): values that would render and
then fail in the cluster (an image nobody can pull, a gated model without a token, router
peers without their token...) are refused at render time with what to set, and what the
chart creates by itself (Secrets, pod labels, RBAC, the CRD upgrade hook) works as a
platform team installs and upgrades it."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.chart.conftest import (CHART, NAMESPACE, RELEASE, model, objects, one, overlay,
                                  render, with_images)
from tests.conftest import REPO, need_module


def _render_error(values: dict) -> str:
    """The chart's refusal of ``values`` (exactly those: no test images laid under)."""
    need_module("helm_python", "helm-python-sdk (pip install helm-python-sdk)")
    from helm_python import Chart, HelmRenderError

    with pytest.raises(HelmRenderError) as exc:
        Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE)
    return str(exc.value)


def _set_values(flags: list[str]) -> dict:
    """Helm's ``--set a.b=v`` / ``--set 'a[0].b=v'`` flags as a values dict (strings)."""
    out: dict = {}
    for flag in flags:
        path, _, value = flag.partition("=")
        node: dict | list = out
        keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]
        for k, nxt in zip(keys, keys[1:] + [None]):
            blank = [] if isinstance(nxt, int) else {}
            if isinstance(k, int):
                while len(node) <= k:
                    node.append(blank)
                if nxt is None:
                    node[k] = value
                node = node[k]
            else:
                node = node.setdefault(k, blank) if nxt is not None else node.__setitem__(k, value)
    return out


def _docs_block(heading: str, starts: str) -> str:
    """The first ```bash block of docs/chart.md's section ``heading`` whose text has
    ``starts``."""
    text = (REPO / "docs" / "chart.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        if starts in block:
            return block
    raise AssertionError(f"no bash block with {starts!r} in docs/chart.md, {heading!r}")


def _helm_install_values(block: str, env: dict[str, str]) -> dict:
    cmd = block[block.index("helm install"):].replace("\\\n", " ").split("\n", 1)[0]
    for k, v in env.items():
        cmd = cmd.replace(f"${k}", v).replace(f"${{{k}}}", v)
    words = shlex.split(cmd)
    return _set_values([words[i + 1] for i, w in enumerate(words) if w == "--set"])


# --- 1. images --------------------------------------------------------------------------

def test_no_image_repository_is_refused_naming_the_values_and_the_build_script():
    msg = _render_error({})
    for value in ("image.repository", "router.image.repository",
                  "modelDefaults.image.repository", "scripts/images/build.py"):
        assert value in msg, msg
    def unset(values):    # the values the refusal names (its first line)
        return _render_error(values).split(" is set for ", 1)[1].split("\n", 1)[0]

    # only what the release's pods run: the router alone needs only its image
    assert unset({"operator": {"enabled": False}, "models": [],
                  "crds": {"upgradeJob": {"enabled": False}}}) == \
        "router.image.repository (anchorage-router)."
    # the endpoint picker runs the router's image
    assert unset({"router": {"enabled": False}, "image": {"repository": "r/anchorage"},
                  "models": [model("a")],
                  "epp": {"enabled": True, "route": {"parentRefs": [{"name": "gw"}]}}}) == \
        "router.image.repository (anchorage-router)."
    # a model's own image is enough for that model
    assert unset({"router": {"enabled": False}, "image": {"repository": "r/anchorage"},
                  "models": [model("a"), {"name": "b", "model": "org/b"}]}) == \
        "modelDefaults.image.repository or models[name=b].image.repository (vllm-anchorage)."
    # no pod, no image: the dashboards alone render
    assert {d["kind"] for d in objects(render(
        {"operator": {"enabled": False}, "router": {"enabled": False}, "models": [],
         "crds": {"upgradeJob": {"enabled": False}}, "rbac": {"aggregatedRoles": False}},
        images=False))} == {"ConfigMap"}


def test_the_documented_private_registry_install_renders():
    block = _docs_block("Images", "--push")
    assert "scripts/images/build.py --registry" in block and "docker-registry regcred" in block
    values = _helm_install_values(block, {"REGISTRY": "registry.example.com/ml"})
    docs = objects(render(values, images=False))
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    images = {c["image"] for p in pods for c in p["containers"]}
    assert {i.rsplit(":", 1)[0] for i in images} == {
        f"registry.example.com/ml/{n}" for n in ("anchorage", "anchorage-router", "vllm-anchorage")}
    assert all(p["imagePullSecrets"] == [{"name": "regcred"}] for p in pods)
    # and the quick start at the top of the page
    top = (REPO / "docs" / "chart.md").read_text().split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", top, re.S)[0]
    objects(render(_helm_install_values(block, {"REGISTRY": "r.example/ml"}), images=False))


# --- 2. the default model -----------------------------------------------------------------

def test_the_default_model_downloads_without_a_token():
    """The default install serves an ungated model and passes no token (a gated default
    crash-looped on 401)."""
    dep = one(objects(render({})), "Deployment", "-qwen-7b")
    vllm = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    assert vllm["args"][0] == "Qwen/Qwen2.5-7B-Instruct"
    assert "HF_TOKEN" not in {e["name"] for e in vllm["env"]}


@pytest.mark.parametrize("gated", ["meta-llama/Llama-3.1-8B-Instruct", "google/gemma-3-12b-it"])
def test_a_gated_model_without_a_token_is_refused(gated):
    msg = _render_error(with_images({"models": [{"name": "m", "model": gated}]}))
    assert f"models[name=m]: {gated} is gated on Hugging Face" in msg
    assert "hfTokenSecret.name" in msg and "kubectl -n llm create secret generic hf-token" in msg
    # a token (per model or in modelDefaults) or the user's own offline/mirror setup is enough
    for ok in ({"models": [{"name": "m", "model": gated, "hfTokenSecret": {"name": "hf"}}]},
               {"models": [{"name": "m", "model": gated}],
                "modelDefaults": {"hfTokenSecret": {"name": "hf"}}},
               {"models": [{"name": "m", "model": gated,
                            "extraEnv": [{"name": "HF_HUB_OFFLINE", "value": "1"}]}]}):
        dep = one(objects(render(ok)), "Deployment", "-m")
        assert dep["spec"]["template"]["spec"]["containers"][0]["args"][0] == gated


# --- 3. several router pods ---------------------------------------------------------------

def _router_container(docs: list[dict]) -> dict:
    dep = one(docs, "Deployment", "-router")
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "router")


def _pod_env(container: dict, docs: list[dict]) -> dict[str, str]:
    """The container's environment as the kubelet gives it: literals, Secret keys from the
    rendered Secrets, field references as a pod would have them."""
    import base64

    secrets = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "Secret"}
    fields = {"metadata.name": "anc-anchorage-router-0", "metadata.namespace": NAMESPACE,
              "status.podIP": "10.0.0.9"}
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            assert ref["name"] in secrets, f"{e['name']}: Secret {ref['name']} is not rendered"
            env[e["name"]] = base64.b64decode(secrets[ref["name"]][ref["key"]]).decode()
        else:
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def _router_starts(docs: list[dict]) -> tuple[int, str]:
    """Run the rendered router container's command line as far as its configuration check
    (`anchorage router ... --print-config`, what the pod runs before Serve starts)."""
    import os
    import subprocess
    import sys

    c = _router_container(docs)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANCHORAGE_")},
           **_pod_env(c, docs)}
    r = subprocess.run([sys.executable, "-m", "anchorage", *c["args"], "--print-config"],
                       capture_output=True, text=True, env=env, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_several_router_pods_get_a_token_the_chart_creates():
    """router.replicaCount 2 rendered and then crash-looped every router pod
    (RouterConfig.validate: peers need ANCHORAGE_INTERNAL_TOKEN); the chart now creates the
    token's Secret (kept: lookup + resource-policy keep) and the pods start."""
    docs = objects(render({"router": {"replicaCount": 2}}))
    rc, out = _router_starts(docs)
    assert rc == 0, out
    assert '"peer_selector": "app.kubernetes.io/instance=anc' in out
    sec = one(docs, "Secret", "-internal")
    assert sec["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    token = _pod_env(_router_container(docs), docs)["ANCHORAGE_INTERNAL_TOKEN"]
    assert len(token) == 48 and token not in out          # never printed
    # one pod: no peers, no token, no Secret
    one_pod = objects(render({}))
    assert not [d for d in one_pod if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-internal")]
    assert "ANCHORAGE_INTERNAL_TOKEN" not in _pod_env(_router_container(one_pod), one_pod)
    # a Secret of the user's: referenced, none created
    mine = objects(render({"router": {"replicaCount": 3},
                           "secrets": {"internal": {"existingSecret": "peers", "key": "k"}}}))
    assert not [d for d in mine if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-internal")]
    ref = next(e for e in _router_container(mine)["env"] if e["name"] == "ANCHORAGE_INTERNAL_TOKEN")
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "peers", "key": "k"}
    # the token set in extraEnv, as documented before: kept, not doubled (SSA rejects that)
    own = objects(render({"router": {"replicaCount": 2, "extraEnv": [
        {"name": "ANCHORAGE_INTERNAL_TOKEN", "value": "x" * 32}]}}))
    names = [e["name"] for e in _router_container(own)["env"]]
    assert names.count("ANCHORAGE_INTERNAL_TOKEN") == 1
    assert _router_starts(own)[0] == 0


# --- 4. pod templates across chart versions ---------------------------------------------------

def _bumped_chart(tmp_path, version: str = "9.9.9", app_version: str | None = None):
    """A copy of the chart with another chart version (and optionally appVersion)."""
    import shutil

    import yaml

    dst = tmp_path / "anchorage"
    shutil.copytree(CHART, dst)
    meta = yaml.safe_load((dst / "Chart.yaml").read_text())
    meta["version"] = version
    if app_version:
        meta["appVersion"] = app_version
    (dst / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return dst


def _render_chart(chart_dir, values: dict) -> list[dict]:
    from helm_python import Chart

    return objects(Chart.load(str(chart_dir)).render(with_images(values), name=RELEASE,
                                                     namespace=NAMESPACE))


def _pod_templates(docs: list[dict]) -> dict[str, dict]:
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            out[d["metadata"]["name"]] = d["spec"]["template"]
        elif d["kind"] == "RayService":
            rc = d["spec"]["rayClusterConfig"]
            out[d["metadata"]["name"] + "/head"] = rc["headGroupSpec"]["template"]
            for g in rc.get("workerGroupSpecs", []):
                out[d["metadata"]["name"] + "/" + g["groupName"]] = g["template"]
    return out


@pytest.mark.parametrize("router", ["deployment", "kuberay", "epp"])
def test_a_chart_version_bump_leaves_every_pod_template_unchanged(tmp_path, router):
    """A pod template that changes replaces its pods (a GPU engine reloads its weights):
    a new chart version with the same images changes no pod template; the objects' own
    labels still say which chart made them."""
    need_module("helm_python", "helm-python-sdk (pip install helm-python-sdk)")
    values = {"commonLabels": {"team": "llm"}}
    if router == "kuberay":
        values["router"] = {"kuberay": {"enabled": True, "workerGroups": [{"name": "w"}]}}
    if router == "epp":                 # the endpoint picker's pods too
        values["epp"] = {"enabled": True, "route": {"parentRefs": [{"name": "gw"}]}}
    old = _render_chart(CHART, values)
    new = _render_chart(_bumped_chart(tmp_path), values)
    before, after = _pod_templates(old), _pod_templates(new)
    assert len(before) >= 3 and before == after
    assert router != "epp" or any(n.endswith("-epp") for n in after)
    for t in after.values():
        assert "helm.sh/chart" not in t["metadata"]["labels"]
        assert "app.kubernetes.io/version" not in t["metadata"]["labels"]
        assert t["metadata"]["labels"]["team"] == "llm"
    dep = one(new, "Deployment", "-qwen-7b")
    assert dep["metadata"]["labels"]["helm.sh/chart"] == "anchorage-9.9.9"
    # the pods still match their selectors and Services
    for d in new:
        if d["kind"] == "Deployment":
            sel = d["spec"]["selector"]["matchLabels"]
            assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()


# --- 6. users' roles, the peering object, the CRD upgrade step ---------------------------

def test_users_roles_for_agentcachepolicies_aggregate_into_view_edit_admin():
    docs = objects(render({}))
    viewer = one(docs, "ClusterRole", "-agentcachepolicies-viewer")
    editor = one(docs, "ClusterRole", "-agentcachepolicies-editor")
    agg = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k[len(agg):] for k, v in viewer["metadata"]["labels"].items()
            if k.startswith(agg) and v == "true"} == {"view", "edit", "admin"}
    assert {k[len(agg):] for k, v in editor["metadata"]["labels"].items()
            if k.startswith(agg) and v == "true"} == {"edit", "admin"}
    verbs = {v for r in viewer["rules"] for v in r["verbs"]}
    assert verbs == {"get", "list", "watch"}
    assert {v for r in editor["rules"] for v in r["verbs"]} >= {"create", "update", "patch", "delete"}
    for r in viewer["rules"] + editor["rules"]:        # policies only, never secrets or pods
        assert r["apiGroups"] == ["anchorage.dev"]
    assert not [d for d in objects(render({"rbac": {"aggregatedRoles": False}}))
                if d["metadata"]["name"].endswith(("-agentcachepolicies-viewer",
                                                   "-agentcachepolicies-editor"))]


def test_two_releases_have_their_own_peering_object_and_cluster_objects():
    """kopf's ClusterKopfPeering was named `anchorage` in every release: a second release
    failed Helm's ownership check on it (cluster-scoped objects of two releases must not
    share a name)."""
    a = objects(render({}, release="team-a", namespace="a"))
    b = objects(render({}, release="team-b", namespace="b"))
    cluster_scoped = ("ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding")
    names_a = {(d["kind"], d["metadata"]["name"]) for d in a if d["kind"] in cluster_scoped}
    names_b = {(d["kind"], d["metadata"]["name"]) for d in b if d["kind"] in cluster_scoped}
    assert names_a and not names_a & names_b, names_a & names_b
    peering = one(a, "ClusterKopfPeering")["metadata"]["name"]
    op = one(a, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    assert peering == "team-a-anchorage" and f"--peering={peering}" in op["args"]
    # a name of one's own still wins (one peering object for operators of several releases)
    own = objects(render({"operator": {"peering": {"name": "shared"}}}))
    assert one(own, "ClusterKopfPeering")["metadata"]["name"] == "shared"


def _hook(docs, kind):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith("-crd-upgrade")]
    assert len(found) == 1, (kind, [d["metadata"]["name"] for d in docs if d["kind"] == kind])
    return found[0]


def test_the_crd_upgrade_hook_runs_before_install_and_upgrade_with_least_privilege():
    import yaml

    docs = objects(render({}))
    job = _hook(docs, "Job")
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Job"):
        ann = _hook(docs, kind)["metadata"]["annotations"]
        assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert "hook-succeeded" in ann["helm.sh/hook-delete-policy"]
    # RBAC and ConfigMap exist before the Job
    assert int(_hook(docs, "ConfigMap")["metadata"]["annotations"]["helm.sh/hook-weight"]) < \
        int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    bundled = {}
    for f in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(f.read_text()):
            bundled[crd["metadata"]["name"]] = crd
    (rule,) = _hook(docs, "ClusterRole")["rules"]
    assert rule == {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                    "resourceNames": sorted(bundled), "verbs": ["get", "patch"]}
    # the ConfigMap carries the chart's crds/ byte for byte; the Job applies them
    cm = _hook(docs, "ConfigMap")
    assert cm["data"] == {f.name: f.read_text() for f in sorted((CHART / "crds").glob("*.yaml"))}
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"].startswith("registry.test/ml/anchorage:")
    assert c["args"] == ["crds", "apply", "/etc/anchorage/crds", "--chart-version=0.1.0"]
    assert pod["serviceAccountName"] == _hook(docs, "ServiceAccount")["metadata"]["name"]
    assert c["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    assert not [d for d in objects(render({"crds": {"upgradeJob": {"enabled": False}}}))
                if d["metadata"]["name"].endswith("-crd-upgrade")]


def test_crds_apply_never_downgrades():
    from anchorage.commands.crds import decide

    assert decide(None, "0.1.0") == "apply"
    assert decide("0.1.0", "0.2.0") == "apply" and decide("0.2.0", "0.2.0") == "apply"
    assert decide("0.3.0", "0.2.0") == "skip" and decide("0.2.0", "0.2.0-rc.1") == "skip"
    assert decide("not-a-version", "0.2.0") == "apply"


def test_crds_apply_fails_with_one_clear_line(tmp_path):
    import os
    import subprocess
    import sys

    def run(*argv, kubeconfig="/nonexistent"):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")},
               "KUBECONFIG": kubeconfig}
        return subprocess.run([sys.executable, "-m", "anchorage", "crds", "apply", *argv],
                              capture_output=True, text=True, env=env, timeout=120)
    r = run(str(tmp_path / "missing"), "--chart-version", "0.1.0")
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = run(str(CHART / "crds"), "--chart-version", "latest")
    assert r.returncode == 2 and "not a semantic version" in r.stderr
    r = run(str(CHART / "crds"), "--chart-version", "0.1.0")
    assert r.returncode == 1 and "no Kubernetes configuration" in r.stderr
    assert "Traceback" not in r.stderr


# --- 5. the access logs the chart points tuning at pass the operator's rule ----------------

def test_the_charts_own_access_log_source_passes_the_operators_rule():
    """With tuning on, the chart fills in the model's own node-agent Service; the
    operator's rule (operator/access_logs.py) accepts exactly that Service for that
    policy's target, read from the rendered objects."""
    from anchorage.operator.access_logs import parse_source, service_problems, source_problems

    docs = objects(render({"models": [model("m", agentCachePolicy={"enabled": True, "spec": {
        "tuning": {"enabled": True, "capacityBlocks": 100,
                   "parameters": [{"name": "horizon", "min": 1, "max": 5}]}}})]}))
    acp = one(docs, "AgentCachePolicy", "-m")
    (src,) = acp["spec"]["tuning"]["accessLogs"]
    assert src == f"http://{RELEASE}-anchorage-m.{NAMESPACE}.svc:9401/v1/access-log"
    assert source_problems([src], NAMESPACE, None) == []
    ref, _ = parse_source(src, NAMESPACE, None)
    svc = one(docs, "Service", "-m")
    dep = one(docs, "Deployment", acp["spec"]["targetRef"]["name"])
    as_read = {"labels": svc["metadata"]["labels"], "type": svc["spec"].get("type"),
               "clusterIP": "10.96.0.10", "selector": svc["spec"]["selector"],
               "ports": [{"name": p["name"], "port": p["port"]} for p in svc["spec"]["ports"]]}
    target = ",".join(f"{k}={v}" for k, v in dep["spec"]["selector"]["matchLabels"].items())
    assert ref.service == svc["metadata"]["name"]
    assert service_problems(ref, as_read, target) == []
    # and not for another model's target
    other = target.replace("anchorage.dev/model=m", "anchorage.dev/model=n")
    assert service_problems(ref, as_read, other)
