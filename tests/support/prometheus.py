"""A real Prometheus server (Debian's ``prometheus``) scraping the brokers under test.

Run as the package's service would not be here (no systemd): one process per test with its
own configuration and TSDB directory, on a free loopback port, scraping every second; stopped
and its directory removed at the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Self

from tests.support.broker import free_port, terminate

BINARY = "prometheus"
START_TIMEOUT_S = 30.0


class Prometheus:
    def __init__(self, root: Path, targets: list[str], interval_s: float = 1.0) -> None:
        """Scrape ``targets`` (``host:port`` of a metrics port) every ``interval_s``."""
        self.root = root
        self.targets = targets
        self.interval_s = interval_s
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if shutil.which(BINARY) is None:
            raise RuntimeError("prometheus is missing: make deps installs Debian's package")
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "prometheus.yml"
        interval = f"{int(self.interval_s * 1000)}ms"
        config.write_text(
            json.dumps(  # (YAML reads JSON)
                {
                    "global": {"scrape_interval": interval, "evaluation_interval": interval},
                    "scrape_configs": [
                        {
                            "job_name": "automq",
                            "scrape_timeout": interval,
                            "static_configs": [{"targets": self.targets}],
                        }
                    ],
                }
            )
        )
        log = open(self.root / "prometheus.log", "ab")  # noqa: SIM115 - the child's lifetime
        self._process = subprocess.Popen(
            [
                BINARY,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.root / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready in {START_TIMEOUT_S:.0f}s: {self.log_tail()}")

    def stop(self) -> None:
        if self._process is not None:
            terminate(self._process, 10)
            self._process = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to (now, or at unix time ``at``)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            answer = json.load(r)
        if answer.get("status") != "success":
            raise RuntimeError(f"{promql}: {answer}")
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def value(self, promql: str, at: float | None = None) -> float:
        """The single value ``promql`` evaluates to."""
        result = self.query(promql, at)
        if len(result) != 1:
            raise AssertionError(f"{promql}: expected one series, got {result}")
        return float(result[0]["value"][1])

    def wait_for(self, promql: str, timeout: float = 20.0) -> float:
        """Wait until ``promql`` has a value (the first scrapes came in)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if len(result) == 1:
                return float(result[0]["value"][1])
            if time.monotonic() > deadline:
                raise AssertionError(f"{promql}: no value after {timeout:.0f}s: {result}")
            time.sleep(0.25)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.root / "prometheus.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
