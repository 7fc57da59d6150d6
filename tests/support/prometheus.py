"""A real Prometheus server for tests (Debian's `prometheus` binary; `make prometheus` installs it).

Started on 127.0.0.1 with a 1 s scrape interval over static targets, with its TSDB in a temporary
folder; `query()` and `query_range()` call the HTTP API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.server_process import free_port, start_http_server, stop_process

INSTALL_HINT = "run `make prometheus` (apt-get install -y --no-install-recommends prometheus)"


def find_prometheus() -> str | None:
    """Path of the prometheus binary, or None."""
    return shutil.which("prometheus")


def build_scrape_config(targets: dict[str, list[str]], interval_ms: int = 1000) -> str:
    """prometheus.yml with one job per name, each scraping `host:port` targets at /metrics."""
    jobs = [
        {"job_name": name, "metrics_path": "/metrics", "static_configs": [{"targets": hosts}]}
        for name, hosts in targets.items()
    ]
    every = f"{interval_ms}ms"  # Prometheus durations are whole numbers with a unit
    config = {"global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
              "scrape_configs": jobs}
    return json.dumps(config, indent=1)  # JSON is YAML


class PrometheusServer:
    """`prometheus` as a subprocess on 127.0.0.1:<free port>, stopped (and its data dropped) by `stop()`."""

    def __init__(self, workdir: Path, targets: dict[str, list[str]], binary: str | None = None,
                 interval_ms: int = 1000) -> None:
        self.binary = binary or find_prometheus()
        if self.binary is None:
            raise FileNotFoundError(f"the prometheus binary is not installed; {INSTALL_HINT}")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(build_scrape_config(targets, interval_ms))
        self.log_path = workdir / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> PrometheusServer:
        """Start and wait for /-/ready."""
        self.process = start_http_server(
            [self.binary or "prometheus", f"--config.file={self.config_path}",
             f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            f"{self.url}/-/ready", name="prometheus", timeout_s=timeout_s, log_path=self.log_path, poll_s=0.2,
        )
        return self

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; return `data` (raises on an error status)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} failed: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query: the result vector."""
        return list(self.api("query", query=expr)["result"])

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets with their health."""
        return list(self.api("targets")["activeTargets"])

    def stop(self) -> None:
        """Terminate the server (idempotent)."""
        stop_process(self.process)
        self.process = None
