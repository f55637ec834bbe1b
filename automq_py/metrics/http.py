"""``metrics.port``: ``/metrics`` (Prometheus' text format), ``/healthz`` and ``/readyz``.

The server is a thread of its own, started before the broker recovers its WAL: a probe gets
its answer while the event loop is busy replaying (``/readyz``: 503, not ready). A scrape's
broker metrics are written on the loop, in short slices (:meth:`BrokerMetrics.render`); the
process collectors' here.

* ``/healthz``: 200 while the process runs and its event loop turns (it ran its lag timer in
  the last ``STALLED_S`` seconds, or the broker is still starting: a WAL replay holds the loop).
* ``/readyz``: 200 once the broker serves: WAL recovered, metadata loaded, listeners open and,
  in a cluster, registered and not fenced; else 503 with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import PROCESS_COLLECTOR
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.gc_collector import GC_COLLECTOR
from prometheus_client.platform_collector import PLATFORM_COLLECTOR

from automq_py.metrics.collector import BrokerMetrics

log = logging.getLogger("automq.metrics")

STALLED_S = 60.0  # the event loop not turning this long (once serving): not alive
SNAPSHOT_TIMEOUT_S = 10.0


class _ProcessFamilies:
    """prometheus-client's process, platform and GC collectors (they read /proc and the
    interpreter, not the broker: they run on the HTTP thread)."""

    def collect(self) -> Iterable[Metric]:
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            yield from collector.collect()


class MetricsServer:
    def __init__(
        self,
        host: str,
        port: int,
        metrics: BrokerMetrics,
        readiness: Callable[[], str | None],
        last_tick: Callable[[], float],
    ) -> None:
        """``readiness``: None when ready, else why not; ``last_tick``: the monotonic time the
        event loop last ran its lag timer (0 before the first)."""
        self._metrics = metrics
        self._readiness = readiness
        self._last_tick = last_tick
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            # (its shutdown waits up to one poll interval: a stop must stay quick)
            target=lambda: self._server.serve_forever(poll_interval=0.1),
            name="metrics-http",
            daemon=True,
        )
        self._thread.start()
        host, port = self._server.server_address[:2]
        log.info(
            "metrics and health checks on http://%s:%d (/metrics, /healthz, /readyz)", host, port
        )

    async def stop(self) -> None:
        await asyncio.to_thread(self._server.shutdown)
        self._server.server_close()

    def scrape(self) -> bytes:
        """On the HTTP thread: the text of every family, the broker's written on its loop."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._metrics.render(), self._loop)
        return future.result(SNAPSHOT_TIMEOUT_S) + generate_latest(_ProcessFamilies())

    def alive(self) -> str | None:
        if self._readiness() is not None:
            return None  # starting (or stopping): a replay may hold the loop for long
        since = time.monotonic() - self._last_tick()
        if since > STALLED_S:
            return f"the event loop has not turned for {since:.0f}s"
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "automq-py"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    try:
                        body = server.scrape()
                    except (FutureTimeout, RuntimeError) as e:
                        self._answer(503, f"the broker did not answer in time: {e!r}\n".encode())
                        return
                    self._answer(200, body, CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    why = server.alive()
                    self._answer(200 if why is None else 503, f"{why or 'ok'}\n".encode())
                elif path == "/readyz":
                    why = server._readiness()
                    self._answer(200 if why is None else 503, f"{why or 'ready'}\n".encode())
                else:
                    self._answer(404, b"not found: /metrics, /healthz, /readyz\n")

            def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s %s", self.address_string(), format % args)

        return Handler
