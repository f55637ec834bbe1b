"""``AutoMQContainer``: the automq-py image as a testcontainers-python container.

    from automq_py.testing.container import AutoMQContainer

    with AutoMQContainer("automq-py:latest") as broker:
        producer = Producer({"bootstrap.servers": broker.get_bootstrap_server()})

As testcontainers' KafkaContainer does, the broker waits inside the container until the mapped
port is known, then starts advertising ``host:mapped-port``, so clients outside the container
reach it through whatever port the engine picked. Extra properties go in as ``KAFKA_*``
environment variables (``with_property("num.partitions", "3")``); the image's defaults keep
the WAL small (256 MiB) and the data in ``/var/lib/automq``.

Needs the ``testcontainers`` package (``pip install 'automq-py[testcontainers]'``).
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from typing import Any

from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

DEFAULT_IMAGE = "automq-py:latest"
PORT = 9092
START_FILE = "/tmp/automq-advertised.listeners"
READY = re.compile(r"serving on")


class AutoMQContainer(DockerContainer):
    """One broker in a container; ``get_bootstrap_server()`` once started."""

    def __init__(self, image: str = DEFAULT_IMAGE, port: int = PORT, **kwargs: Any) -> None:
        super().__init__(image, **kwargs)
        self.port = port
        self.with_exposed_ports(port)
        self.with_env("KAFKA_LISTENERS", f"PLAINTEXT://0.0.0.0:{port}")

    def with_property(self, name: str, value: str) -> AutoMQContainer:
        """Set a broker property (as its ``KAFKA_*`` variable)."""
        variable = name.replace("_", "__").replace("-", "___").replace(".", "_").upper()
        self.with_env(f"KAFKA_{variable}", value)
        return self

    def get_bootstrap_server(self) -> str:
        return f"{self.get_container_host_ip()}:{self.get_exposed_port(self.port)}"

    def start(self, timeout: float = 60) -> AutoMQContainer:
        self.with_command(
            [
                "sh",
                "-c",
                f"while [ ! -f {START_FILE} ]; do sleep 0.05; done; exec automq-py serve --env "
                f'--override "advertised.listeners=$(cat {START_FILE})"',
            ]
        )
        super().start()
        self._put_file(START_FILE, f"PLAINTEXT://{self.get_bootstrap_server()}".encode())
        wait = LogMessageWaitStrategy(READY)
        wait.with_startup_timeout(int(timeout))
        wait.wait_until_ready(self)
        return self

    def _put_file(self, path: str, content: bytes) -> None:
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(content)
            info.mtime = int(time.time())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
        self.get_wrapped_container().put_archive("/", archive.getvalue())
