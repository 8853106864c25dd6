"""``python -m tests.cluster.helmcli ACTION KUBECONFIG RELEASE NAMESPACE [VALUES.json]``:
helm install / upgrade / uninstall through helm-python-sdk (the Helm v4 SDK, in process),
as its own process: the test runs it with ``nsenter --net`` so the SDK's Go threads live in
the cluster's network namespace (a Python thread's setns would not move them). Prints the
release as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHART = Path(__file__).resolve().parents[2] / "charts" / "anchorage"


def main(argv: list[str]) -> int:
    from helm_python import Config

    action, kubeconfig, release, namespace = argv[:4]
    values = json.loads(Path(argv[4]).read_text()) if len(argv) > 4 else {}
    helm = Config(kubeconfig_path=kubeconfig, namespace=namespace)
    if action == "install":
        rel = helm.install(str(CHART), release, values, namespace=namespace,
                           create_namespace=True, timeout=300)
    elif action == "upgrade":
        rel = helm.upgrade(str(CHART), release, values, namespace=namespace, timeout=300)
    elif action == "uninstall":
        rel = helm.uninstall(release, timeout=300, wait="watcher")
    else:
        print(f"unknown action {action!r}", file=sys.stderr)
        return 2
    print(json.dumps(rel if isinstance(rel, dict) else getattr(rel, "__dict__", str(rel)),
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
