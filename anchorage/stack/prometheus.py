"""A local Prometheus scraping every piece of the stack (engines, node agents, router),
listening on loopback only. Optional: ``find_binary`` returns None when it is not installed
(``scripts/setup.d/40-prometheus.sh`` installs Debian's package)."""

from __future__ import annotations

import shutil
from pathlib import Path


def find_binary() -> str | None:
    return shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)


def config_text(jobs: dict[str, list[str]], interval_s: float = 2.0) -> str:
    """Prometheus YAML: one scrape job per name, targets ``host:port`` (JSON is YAML)."""
    import json

    return json.dumps({
        "global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
        "scrape_configs": [{"job_name": name, "static_configs": [{"targets": targets}]}
                           for name, targets in jobs.items() if targets],
    }, indent=1)


def command(binary: str, workdir: Path, port: int) -> list[str]:
    return [binary, f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
