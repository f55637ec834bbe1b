"""segmentio/kafka-go's own integration suite against the real broker process.

kafka-go's tests (its root package: the Conn, Reader and Writer, consumer groups, the Client's
admin and transaction requests; and its ``sasl`` package) expect the broker of its
docker-compose files on fixed addresses: ``localhost:9092`` in plain text and
``localhost:9093`` with SASL (PLAIN for ``adminplain``, SCRAM-SHA-256 and -512 for
``adminscram``), an authorizer that allows everyone when no ACL matches, topic auto-creation on
and ``message.max.bytes`` 200000000. Here that broker is one broker process with those settings
on 127.0.0.1, its SCRAM credentials created as ``kafka-configs`` would. ``make deps`` builds
both test binaries from the module the Go proxy serves (``KAFKA_GO`` in the Makefile) into
``.go/``, beside the package's sources.

``KAFKA_VERSION`` names the Kafka whose behaviour the tests expect: 3.9, the version this broker
speaks. Its tests of transactions skip themselves from Kafka 3.0 on, as they do in kafka-go's
CI. Left out, with the reason: four subtests of ``TestReaderConsumerGroup`` that fail against
Apache Kafka itself. Three read the group's offsets through a ``ConsumerGroup`` built without its
dialer (a nil function call that ends the test binary); the rebalance one reads twelve records
from each of two readers of a three-partition topic holding eight a partition, which one reader
with a single partition cannot.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from automq_py.testing.process import port_free
from tests.automq_py.conftest import MakeBroker
from tests.support.go_suite import SuiteRun, built, run_suite

# the Go clients' suites (each a busy set of clients) run one after the other, on one worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("go-suites")]

PLAIN_PORT, SASL_PORT = 9092, 9093  # fixed by the suite
KAFKA_VERSION = "3.9.0"
# the docker-compose file's broker settings that differ from Kafka's defaults
COMPOSE_PROPERTIES = {
    "node.id": "1",
    "listeners": f"PLAIN://127.0.0.1:{PLAIN_PORT},SASL://127.0.0.1:{SASL_PORT}",
    "advertised.listeners": f"PLAIN://localhost:{PLAIN_PORT},SASL://localhost:{SASL_PORT}",
    "listener.security.protocol.map": "PLAIN:PLAINTEXT,SASL:SASL_PLAINTEXT",
    "inter.broker.listener.name": "PLAIN",
    "auto.create.topics.enable": "true",
    "message.max.bytes": "200000000",
    "group.initial.rebalance.delay.ms": "0",
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
    "listener.name.sasl.plain.sasl.jaas.config": (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'user_adminplain="admin-secret";'
    ),
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
    # Kafka's log cleaner runs (in the broker here, as Spark would take long to start beside the
    # suite): a test waits for a compacted topic's duplicates to go
    "s3.maintenance.runner": "local",
}
SCRAM_CREDENTIALS = [
    ("adminscram", ScramMechanism.SCRAM_SHA_256, "admin-secret-256"),
    ("adminscram", ScramMechanism.SCRAM_SHA_512, "admin-secret-512"),
]
# subtests of TestReaderConsumerGroup
FAIL_AGAINST_KAFKA = [
    "consumer_group_commits_on_close",
    "verify_offset_committed",
    "verify_offset_committed_when_using_interval_committer",
    "consumer_group_rebalance",
]


def run(binary: Path, log: Path, *args: str) -> SuiteRun:
    env = dict(os.environ, KAFKA_VERSION=KAFKA_VERSION)
    env.pop("KAFKA_SKIP_NETTEST", None)  # its net.Conn conformance tests run too
    # in the package's directory: some tests read its fixtures
    done = run_suite(
        binary, ["-test.timeout", "480s", *args], cwd=binary.parent, env=env, log=log, timeout=540
    )
    failed = done.named("FAIL")
    assert done.returncode == 0 and not failed, f"failed: {failed}\n{done.text[-6000:]}"
    return done


@pytest.mark.timeout(720)  # the suite's ~4 min, longer on a loaded machine
def test_kafka_go_suite_passes(make_broker: MakeBroker, tmp_path: Path) -> None:
    # beside its package's sources
    suite, sasl_suite = built("kafka-go-*/kafka-go.test"), built("kafka-go-*/sasl/sasl.test")
    for port in (PLAIN_PORT, SASL_PORT):
        assert port_free(port), f"kafka-go's suite needs 127.0.0.1:{port}, which is taken"
    broker = make_broker(**COMPOSE_PROPERTIES)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for user, mechanism, password in SCRAM_CREDENTIALS:  # one a request: Kafka's rule
        upserts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(
                user, ScramCredentialInfo(mechanism, 4096), password.encode()
            )
        ]
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result(30)
    del admin  # librdkafka's client goes with its last reference

    # -test.skip matches each level of a subtest's name with its own pattern
    skip = "^TestReaderConsumerGroup$/^(" + "|".join(FAIL_AGAINST_KAFKA) + ")$"
    passed = set(run(suite, tmp_path / "kafka-go.log", "-test.skip", skip).named("PASS"))
    # the suite ran, its broker-facing tests among what passed
    wanted = {"TestConn/nettest", "TestReaderConsumerGroup/basic_handshake", "TestWriter"}
    assert len(passed) > 450 and wanted <= passed, sorted(passed)

    passed = set(run(sasl_suite, tmp_path / "sasl.log").named("PASS"))
    mechanisms = {"PLAIN_success", "SCRAM-SHA-256_success", "SCRAM-SHA-512_success"}
    assert {f"TestSASL/{m}" for m in mechanisms} <= passed, sorted(passed)
