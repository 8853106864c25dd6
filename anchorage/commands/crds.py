"""`anchorage crds apply`: bring the cluster's CustomResourceDefinitions to the chart's.

    anchorage crds apply /etc/anchorage/crds --chart-version 0.2.0

Helm installs `crds/` once and never upgrades it, so an upgraded chart would render
AgentCachePolicies with fields the old CRD prunes. The chart's pre-install/pre-upgrade hook
Job (templates/crd-upgrade.yaml, as NVIDIA Dynamo's platform chart does with its
`upgrade-crd.yaml`) runs this with the CRD files of the chart being installed.

The rule: each CustomResourceDefinition in DIR (*.yaml, several documents a file) is
server-side applied (field manager ``anchorage-crds``, conflicts forced: Helm created them
from ``crds/``) and annotated ``anchorage.dev/chart-version: <version>``, unless the live
CRD carries a higher chart version there (another release of a newer chart applied it: an
older chart never downgrades a schema). A CRD that is not in the cluster is an error (the
hook's RBAC may get and patch only the chart's own CRDs, by name; Helm creates them from
``crds/`` before any hook). Exit 0 when every CRD is current, 1 when one failed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

VERSION_ANNOTATION = "anchorage.dev/chart-version"
FIELD_MANAGER = "anchorage-crds"


def register(sub) -> None:
    p = sub.add_parser("crds", help="apply the chart's CustomResourceDefinitions (upgrade hook)",
                       description=__doc__.split("\n\n")[0])
    s = p.add_subparsers(dest="crds_command", metavar="ACTION", required=True)
    a = s.add_parser("apply", help="server-side apply the CRDs of a directory")
    a.add_argument("dir", help="directory of CRD YAML files (the chart's crds/)")
    a.add_argument("--chart-version", required=True,
                   help="the chart version these CRDs come with (never downgraded)")
    a.add_argument("--json", action="store_true", help="print the outcome as JSON on stdout")
    a.set_defaults(func=run)


def _semver(v: str) -> tuple:
    """``1.2.3[-pre]`` as a sortable tuple (a pre-release sorts before its release)."""
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+.*)?$", v.strip())
    if not m:
        raise ValueError(f"not a semantic version: {v!r}")
    major, minor, patch, pre = m.groups()
    return (int(major), int(minor), int(patch), 0 if pre else 1, pre or "")


def decide(live_version: str | None, bundled: str) -> str:
    """``apply`` or ``skip`` (the live CRD came with a newer chart). Pure."""
    if live_version:
        try:
            if _semver(live_version) > _semver(bundled):
                return "skip"
        except ValueError:
            pass              # an annotation nobody could compare: ours wins
    return "apply"


def load_crds(directory: Path) -> list[dict]:
    import yaml

    out = []
    for f in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                out.append(doc)
    return out


def _api():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiextensionsV1Api()


def apply(crds: list[dict], version: str, api=None) -> list[dict]:
    """Apply each CRD (the module's rule); one outcome per CRD."""
    from kubernetes.client.rest import ApiException

    _semver(version)
    api = api or _api()
    out = []
    for crd in crds:
        name = crd["metadata"]["name"]
        try:
            live = api.read_custom_resource_definition(name)
        except ApiException as e:
            why = ("not in the cluster (Helm installs it from the chart's crds/; with "
                   "--skip-crds apply them yourself)") if e.status == 404 else \
                f"cannot read it: {e.status} {e.reason}"
            out.append({"name": name, "action": "error", "message": why})
            continue
        had = (live.metadata.annotations or {}).get(VERSION_ANNOTATION)
        if decide(had, version) == "skip":
            out.append({"name": name, "action": "skip",
                        "message": f"the cluster's is from chart {had}, newer than {version}"})
            continue
        body = json.loads(json.dumps(crd))
        body.setdefault("metadata", {}).setdefault("annotations", {})[VERSION_ANNOTATION] = version
        for k in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            body["metadata"].pop(k, None)
        body.pop("status", None)
        try:
            api.patch_custom_resource_definition(
                name, body, field_manager=FIELD_MANAGER, force=True,
                _content_type="application/apply-patch+yaml")
        except ApiException as e:
            out.append({"name": name, "action": "error",
                        "message": f"apply failed: {e.status} {e.reason}"})
            continue
        out.append({"name": name, "action": "applied", "from": had, "to": version})
    return out


def run(args) -> int:
    from anchorage.cli import CLIError

    d = Path(args.dir)
    if not d.is_dir():
        raise CLIError(f"{d}: not a directory")
    try:
        _semver(args.chart_version)
    except ValueError as e:
        raise CLIError(str(e)) from None
    crds = load_crds(d)
    if not crds:
        raise CLIError(f"{d}: no CustomResourceDefinition in its *.yaml files")
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from anchorage.cli import CommandFailed
    try:
        results = apply(crds, args.chart_version)
    except ConfigException as e:
        raise CommandFailed(f"no Kubernetes configuration (in-cluster or KUBECONFIG): {e}") from None
    except HTTPError as e:
        raise CommandFailed(f"cannot reach the API server: {e}") from None
    for r in results:
        print(f"{r['name']}: {r['action']}" + (f" ({r['message']})" if r.get("message") else ""),
              file=sys.stderr)
    if args.json:
        print(json.dumps({"chart_version": args.chart_version, "crds": results}))
    return 1 if any(r["action"] == "error" for r in results) else 0
