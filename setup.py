"""Maps the top-level folders onto one distribution.

`operator/`, `router/` and `node_agent/` are the subpackages `anchorage.operator`,
`anchorage.router` and `anchorage.node_agent` (a top-level `operator` package would
shadow the standard library).
"""
import os

from setuptools import setup

ROOTS = {
    "anchorage": "anchorage",
    "anchorage.operator": "operator",
    "anchorage.router": "router",
    "anchorage.node_agent": "node_agent",
}


def _discover():
    packages, package_dir = [], {}
    for pkg, folder in ROOTS.items():
        package_dir[pkg] = folder
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            if "__init__.py" not in filenames:
                continue
            rel = os.path.relpath(dirpath, folder)
            name = pkg if rel == "." else pkg + "." + rel.replace(os.sep, ".")
            if name.split(".")[1:2] in (["operator"], ["router"], ["node_agent"]) and pkg == "anchorage":
                continue
            packages.append(name)
    return packages, package_dir


packages, package_dir = _discover()
setup(packages=packages, package_dir=package_dir, include_package_data=True,
      package_data={"anchorage": ["data/*"]})
