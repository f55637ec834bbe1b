"""AutoMQCluster: a throwaway cluster of broker processes for a test suite.

The brokers (node.id 0..n-1) are :class:`AutoMQProcess` instances sharing one metadata database
in a private PostgreSQL (:class:`PostgresServer`) and one object store: a local directory
(``s3.data.buckets=0@file:///<root>/objects``), which every broker on one machine reaches.
``start()`` returns once every broker lists all of them in its Metadata; ``stop()`` stops the
brokers (SIGTERM: each hands its partitions to the others), then PostgreSQL, and removes
everything.

    with AutoMQCluster(3, {"num.partitions": "6"}) as cluster:
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers})
        cluster.brokers[1].kill()           # as a crash; .start() brings it back on its data
        cluster.wait_for_brokers()          # until the others have fenced it

The layout under ``directory``: ``objects/`` and ``broker<N>/`` (each broker's data and
``broker.log``); PostgreSQL's files are in a directory of its own in the system's temporary
directory (under root, the ``postgres`` user must be able to enter it).
"""

from __future__ import annotations

import shutil
import socket
import struct
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from automq_py.testing.postgres import PostgresServer
from automq_py.testing.process import AutoMQError, AutoMQProcess

# What makes a test cluster notice a lost broker quickly (the defaults are 2000 and 9000 ms);
# a property the caller passes wins.
CLUSTER_TEST_PROPERTIES: Mapping[str, str] = {
    "broker.heartbeat.interval.ms": "1000",
    "broker.session.timeout.ms": "6000",
}

# The cluster owns these: they follow from the brokers' places in it, its database and the
# brokers' ports and directories.
_RESERVED = ("node.id", "metadata.store.url", "listeners", "log.dirs", "log.dir")

METADATA_API_KEY = 3
CORRELATION_ID = 0x434C5553  # "CLUS"
CLIENT_ID = b"automq-py-testing"


def listed_brokers(bootstrap: str, timeout: float = 5.0) -> dict[int, str]:
    """node.id -> ``host:port`` of the brokers that ``bootstrap`` lists in Metadata (v1).

    ============  ===========================================================
    request       api key 3, version 1, correlation id, client id; topics: an
                  empty array (none)
    response      correlation id; brokers: int32 count, then per broker
                  node id int32, host string, port int32, rack nullable string;
                  (controller id and topics follow, unread)
    ============  ===========================================================
    """
    host, _, port = bootstrap.rpartition(":")
    header = struct.pack(">hhih", METADATA_API_KEY, 1, CORRELATION_ID, len(CLIENT_ID)) + CLIENT_ID
    request = header + struct.pack(">i", 0)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _read(s, 4))
        body = _read(s, size)
    correlation_id, count = struct.unpack_from(">ii", body)
    if correlation_id != CORRELATION_ID:
        raise AutoMQError(f"{bootstrap}: Metadata answered correlation id {correlation_id}")
    offset = 8
    brokers = {}
    for _ in range(count):
        node_id, host_length = struct.unpack_from(">ih", body, offset)
        offset += 6
        broker_host = body[offset : offset + host_length].decode()
        offset += host_length
        broker_port, rack_length = struct.unpack_from(">ih", body, offset)
        offset += 6 + max(rack_length, 0)
        brokers[node_id] = f"{broker_host}:{broker_port}"
    return brokers


def _read(s: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return bytes(data)


class AutoMQCluster:
    """``brokers`` broker processes on free loopback ports forming one cluster.

    ``properties`` go to every broker over :data:`CLUSTER_TEST_PROPERTIES` and AutoMQProcess's
    test defaults (``s3.data.buckets`` may name a real S3 bucket instead of the directory);
    ``node.id`` and ``metadata.store.url`` are set by the cluster. Without ``directory`` a
    temporary one is made; ``stop()`` removes it unless ``keep_directory``.
    ``brokers[i]`` is node ``i``, an :class:`AutoMQProcess` whose ``stop()`` and ``kill()``
    keep its data, so its ``start()`` brings the same broker back on the same port.
    """

    def __init__(
        self,
        brokers: int = 3,
        properties: Mapping[str, str | int] | None = None,
        *,
        directory: str | Path | None = None,
        keep_directory: bool = False,
        start_timeout: float = 60.0,
        stop_timeout: float = 30.0,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"brokers: at least 1, got {brokers}")
        reserved = [name for name in _RESERVED if name in (properties or {})]
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: set by AutoMQCluster")
        # first: it raises when PostgreSQL is not installed, before a directory is made
        self.postgres = PostgresServer(keep_directory=keep_directory)
        self.directory = Path(
            directory if directory is not None else tempfile.mkdtemp(prefix="automq-cluster-")
        )
        self.keep_directory = keep_directory
        self.start_timeout = start_timeout
        self.properties: dict[str, str] = {
            "s3.data.buckets": f"0@{self.objects_dir.as_uri()}",
            "cluster.id": f"test-{time.time_ns():x}",
            **CLUSTER_TEST_PROPERTIES,
            **{k: str(v) for k, v in (properties or {}).items()},
        }
        self.metadata_store_url: str | None = None
        self.brokers = [
            AutoMQProcess(
                {**self.properties, "node.id": str(node_id)},
                directory=self.directory / f"broker{node_id}",
                keep_directory=True,  # the cluster removes it: a restart reuses the data
                start_timeout=start_timeout,
                stop_timeout=stop_timeout,
            )
            for node_id in range(brokers)
        ]

    @property
    def objects_dir(self) -> Path:
        """The object store the brokers share, unless ``s3.data.buckets`` names another."""
        return self.directory / "objects"

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>`` of every running broker, comma-separated."""
        running = [b.bootstrap_servers for b in self.brokers if b.is_running()]
        if not running:
            raise AutoMQError("no broker of the cluster is running")
        return ",".join(running)

    def start(self) -> AutoMQCluster:
        """Start PostgreSQL, create the metadata database, start the brokers and wait until
        each lists them all. On failure everything is stopped and removed as by :meth:`stop`
        and :class:`AutoMQError` says why."""
        try:
            self.objects_dir.mkdir(parents=True, exist_ok=True)
            self.postgres.start()
            self.metadata_store_url = self.postgres.create_database("metadata")
            for broker in self.brokers:
                broker.properties["metadata.store.url"] = self.metadata_store_url
            # node 0 first (it becomes the controller), then the others side by side
            first, *others = self.brokers
            first.start()
            with ThreadPoolExecutor(max(len(others), 1)) as pool:
                for started in [pool.submit(broker.start) for broker in others]:
                    started.result()
            self.wait_for_brokers(self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_for_brokers(self, timeout: float = 30.0) -> None:
        """Until every running broker lists exactly the running brokers in Metadata (after a
        kill, that is once the others have fenced the lost one)."""
        running = {node_id: b for node_id, b in enumerate(self.brokers) if b.is_running()}
        deadline = time.monotonic() + timeout
        for node_id, broker in running.items():
            while True:
                try:
                    listed = listed_brokers(broker.bootstrap_servers)
                except (OSError, struct.error) as e:
                    listed, why = {}, str(e)
                else:
                    why = f"lists nodes {sorted(listed)}"
                if listed.keys() == running.keys():
                    break
                if time.monotonic() > deadline:
                    raise AutoMQError(
                        f"broker {node_id} {why}, not {sorted(running)}, after {timeout} s:\n"
                        f"{broker.log_tail()}"
                    )
                time.sleep(0.1)

    def stop(self, *, check: bool = False) -> list[int | None]:
        """Stop the brokers one after another (SIGTERM, SIGKILL after ``stop_timeout``), then
        PostgreSQL, and remove the directories (unless ``keep_directory``). Returns the
        brokers' exit codes (None: not running); with ``check`` one other than 0 raises
        :class:`AutoMQError` with its log. Calling it again does nothing."""
        codes = []
        failures = []
        try:
            for node_id, broker in enumerate(self.brokers):
                code = broker.stop()
                codes.append(code)
                if check and code not in (0, None):
                    failures.append(f"broker {node_id} exited with {code}:\n{broker.log_tail()}")
        finally:
            self.postgres.stop()
            if not self.keep_directory:
                shutil.rmtree(self.directory, ignore_errors=True)
        if failures:
            raise AutoMQError("\n\n".join(failures))
        return codes

    def __enter__(self) -> AutoMQCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"AutoMQCluster({self.brokers!r}, {str(self.directory)!r})"
