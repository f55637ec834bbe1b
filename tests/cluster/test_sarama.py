"""Sarama's own functional suite against a five-broker cluster.

Sarama's functional tests (IBM/sarama, build tag ``functional``) expect the cluster of its
docker-compose file: brokers 1 to 5, each reached by clients through a toxiproxy proxy on
127.0.0.1:29091-29095, which the tests cut, slow down and reset to test a client's failure
handling, and by the other brokers on a listener of their own; topic auto-creation off and no
initial rebalance delay. Here the five are broker
processes over one PostgreSQL database and one SeaweedFS, each advertising its proxy's address,
and the proxies are toxiproxy's own server; ``make deps`` builds both binaries from the modules
the Go proxy serves (``SARAMA``, ``TOXIPROXY`` in the Makefile) into ``.go/``.

The tests that stop and start a broker (``docker compose stop kafka-2``) or read its log
(``docker compose logs kafka-2``) run ``docker``: a stand-in first on their ``PATH`` does that to
the broker processes, SIGTERM and a restart on the same data, as ``docker compose`` does to a
container.

Left out, as a broker whose partitions have one replica cannot answer them: follower fetching
(KIP-392) and growing a partition's replica set, both of which need replicas beside the leader;
a partition's data is in shared storage and its one replica moves instead. The Java interop
tests run Kafka's console tools inside the compose file's containers; they skip themselves
against a cluster they did not start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from automq_py.testing.process import port_free
from tests.cluster.conftest import Cluster, ClusterFactory
from tests.support.broker import free_port
from tests.support.go_suite import built, run_suite

# the Go clients' suites (each a busy set of clients) run one after the other, on one worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("go-suites")]

PROXY_PORTS = range(29091, 29096)  # brokers 1..5, fixed by the suite
# the compose file's broker settings that differ from Kafka's defaults
COMPOSE_PROPERTIES = {
    "auto.create.topics.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
    "default.replication.factor": "2",
    "offsets.topic.replication.factor": "2",
    "transaction.state.log.replication.factor": "2",
}
NOT_FOR_ONE_REPLICA = [
    "TestConsumerFetchFollowerFailover",
    "TestFuncAdminAlterPartitionReassignments",
]

DOCKER_STAND_IN = """#!{python}
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["AUTOMQ_DOCKER_STAND_IN"])
s.sendall("\\0".join(sys.argv[1:]).encode())
s.shutdown(socket.SHUT_WR)
answer = b"".join(iter(lambda: s.recv(65536), b""))
code, _, out = answer.partition(b"\\n")
sys.stdout.buffer.write(out)
sys.exit(int(code))
"""


class DockerStandIn(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves the ``docker compose`` commands the suite runs, on the cluster's brokers:
    ``stop``, ``start`` and ``logs`` of service ``kafka-<node id>``."""

    daemon_threads = True

    def __init__(self, path: str, cluster: Cluster) -> None:
        self.cluster = cluster
        self.lock = threading.Lock()
        super().__init__(path, _Command)

    def run(self, args: list[str]) -> tuple[int, str]:
        if args[:1] != ["compose"] or not args[-1].startswith("kafka-"):
            return 1, f"not served here: docker {' '.join(args)}\n"
        verb = next(a for a in args[1:] if not a.startswith("-"))
        broker = self.cluster.brokers[int(args[-1][len("kafka-") :]) - self.cluster.first_node_id]
        with self.lock:
            if verb == "stop":
                broker.stop(timeout=10)  # docker compose's grace before SIGKILL
                return 0, ""
            if verb == "start":
                if not broker.running:
                    broker.start()
                return 0, ""
            if verb == "logs":
                return 0, broker.log_path.read_text(errors="replace")
        return 1, f"not served here: docker {' '.join(args)}\n"


class _Command(socketserver.StreamRequestHandler):
    server: DockerStandIn

    def handle(self) -> None:
        args = self.rfile.read().decode().split("\0")
        try:
            code, out = self.server.run(args)
        except Exception as e:  # told to the test, which fails on it
            code, out = 1, f"{type(e).__name__}: {e}\n"
        self.wfile.write(f"{code}\n{out}".encode())


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a path short enough for a unix socket."""
    path = Path(tempfile.mkdtemp(prefix="aqsarama-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_sarama_functional_suite_passes(
    cluster_factory: ClusterFactory, tmp_path: Path, short_dir: Path
) -> None:
    binary = built("sarama-*/sarama.test")
    toxiproxy = built("toxiproxy-*/toxiproxy-server")
    taken = [p for p in PROXY_PORTS if not port_free(p)]
    assert not taken, f"Sarama's suite needs ports {taken} free"

    cluster = cluster_factory(0, first_node_id=1, **COMPOSE_PROPERTIES)
    for port in PROXY_PORTS:
        # as in the compose file: clients through the proxy, brokers to each other directly
        own, internal = free_port(), free_port()
        cluster.add(
            **{
                "listeners": f"CLIENT://127.0.0.1:{own},INTERNAL://127.0.0.1:{internal}",
                "advertised.listeners": (
                    f"CLIENT://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}"
                ),
                "listener.security.protocol.map": "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT",
                "inter.broker.listener.name": "INTERNAL",
                "broker.rack": str(len(cluster.brokers) + 1),
            }
        )
    cluster.wait_for_brokers(len(PROXY_PORTS))

    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    with open(tmp_path / "toxiproxy.log", "wb") as toxi_log:
        proxy = subprocess.Popen(
            [str(toxiproxy), "-host", "127.0.0.1", "-port", str(api_port)],
            stdout=toxi_log,
            stderr=subprocess.STDOUT,
        )
    stand_in = DockerStandIn(str(short_dir / "docker.sock"), cluster)
    server = threading.Thread(target=stand_in.serve_forever, daemon=True)
    server.start()
    try:
        _create_proxies(api, cluster)
        bin_dir = short_dir / "bin"
        bin_dir.mkdir()
        docker = bin_dir / "docker"
        docker.write_text(DOCKER_STAND_IN.replace("{python}", sys.executable))
        docker.chmod(0o755)
        env = dict(
            os.environ,
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            AUTOMQ_DOCKER_STAND_IN=str(short_dir / "docker.sock"),
            TOXIPROXY_ADDR=api,
            KAFKA_VERSION="4.0.0",  # the Kafka its version-gated tests take this broker for
        )
        skip = "^(" + "|".join(NOT_FOR_ONE_REPLICA) + ")$"
        run = run_suite(
            binary,
            ["-test.timeout", "600s", "-test.skip", skip],
            cwd=binary.parent,
            env=env,
            log=tmp_path / "sarama.log",
            timeout=660,
        )
    finally:
        stand_in.shutdown()
        stand_in.server_close()
        proxy.terminate()
        proxy.wait(10)
    failed, passed, skipped = run.named("FAIL"), run.named("PASS"), run.named("SKIP")
    print(f"Sarama's suite: {len(passed)} passed, {len(skipped)} skipped {skipped}")
    assert run.returncode == 0 and not failed, f"failed: {failed}\n{_failures(run.text)}"
    assert len(passed) > 60 and {
        "TestFuncAdminListConsumerGroupOffsets",
        "TestFuncTxnProduceWithBrokerFailure",
        "TestFuncConsumerGroupPartitioning",
    } <= set(passed), passed


def _create_proxies(api: str, cluster: Cluster) -> None:
    """Proxies ``kafka1``..``kafka5`` from the suite's ports to the brokers' own listeners."""
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"{api}/version", timeout=1).read()
            break
        except OSError:
            assert time.monotonic() < deadline, "toxiproxy's server did not start"
            time.sleep(0.05)
    for i, (port, broker) in enumerate(zip(PROXY_PORTS, cluster.brokers, strict=True)):
        body = {
            "name": f"kafka{i + 1}",
            "listen": f"127.0.0.1:{port}",
            "upstream": broker.bootstrap,
        }
        request = urllib.request.Request(
            f"{api}/proxies", data=json.dumps(body).encode(), method="POST"
        )
        urllib.request.urlopen(request, timeout=5).read()


def _failures(text: str) -> str:
    """The suite's lines about its failures (its output interleaves parallel tests)."""
    lines = text.splitlines()
    keep = [
        line
        for line in lines
        if re.search(r"--- FAIL|Error:|Messages:|_test\.go:\d+: |panic", line)
    ]
    return "\n".join(keep[-120:])
