"""Kafka's Java clients and tools against the real broker's secured listeners: a SCRAM user
created with ``kafka-configs --alter --add-config 'SCRAM-SHA-512=[...]'``, then the console
producer and consumer over SASL_SSL with it (the truststore a PEM file), over SSL with a client
certificate, and a wrong password refused as Kafka refuses it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.automq_py.security.conftest import SecureBroker, write
from tests.support.java import run_tool

pytestmark = pytest.mark.integration


def client_properties(path: Path, secure: SecureBroker, listener: str, **extra: str) -> Path:
    lines = ["ssl.truststore.type=PEM", f"ssl.truststore.location={secure.certs.ca}"]
    lines.append(f"security.protocol={'SSL' if listener == 'MTLS' else listener}")
    lines += [f"{k}={v}" for k, v in extra.items()]
    return write(path, "\n".join(lines) + "\n")


def scram_jaas(user: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )


def test_java_clients_over_sasl_ssl_with_a_user_kafka_configs_created(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    user, password = f"carol-{uuid.uuid4().hex[:4]}", "carol-secret"
    run_tool(
        "kafka-configs",
        "--bootstrap-server",
        secure_broker.address("PLAINTEXT"),
        "--alter",
        "--add-config",
        f"SCRAM-SHA-512=[iterations=8192,password={password}]",
        "--entity-type",
        "users",
        "--entity-name",
        user,
    )
    config = client_properties(
        tmp_path / "client.properties",
        secure_broker,
        "SASL_SSL",
        **{"sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": scram_jaas(user, password)},
    )
    topic = f"java-sec-{uuid.uuid4().hex[:6]}"
    run_tool(
        "kafka-topics",
        "--bootstrap-server",
        secure_broker.address("SASL_SSL"),
        "--command-config",
        str(config),
        "--create",
        "--topic",
        topic,
        "--partitions",
        "2",
    )
    lines = [f"java-{i}" for i in range(20)]
    run_tool(
        "kafka-console-producer",
        "--bootstrap-server",
        secure_broker.address("SASL_SSL"),
        "--command-config",
        str(config),
        "--topic",
        topic,
        stdin="\n".join(lines) + "\n",
    )
    mtls = client_properties(
        tmp_path / "mtls.properties",
        secure_broker,
        "MTLS",
        **{
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": _one_line(secure_broker.certs.client_cert),
            "ssl.keystore.key": _one_line(secure_broker.certs.client_key),
        },
    )
    for listener, props in (("SASL_SSL", config), ("MTLS", mtls)):
        read = run_tool(
            "kafka-console-consumer",
            "--bootstrap-server",
            secure_broker.address(listener),
            "--command-config",
            str(props),
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            str(len(lines)),
            "--timeout-ms",
            "30000",
        )
        assert sorted(read.lines()) == sorted(lines), (listener, read.stderr[-2000:])

    wrong = client_properties(
        tmp_path / "wrong.properties",
        secure_broker,
        "SASL_SSL",
        **{"sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": scram_jaas(user, "nope")},
    )
    refused = run_tool(
        "kafka-topics",
        "--bootstrap-server",
        secure_broker.address("SASL_SSL"),
        "--command-config",
        str(wrong),
        "--list",
        check=False,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "SaslAuthenticationException" in refused.stderr + refused.stdout
    assert "invalid credentials" in refused.stderr + refused.stdout


def _one_line(path: Path) -> str:
    """A PEM file as a properties value: one line, its line breaks as ``\\n`` escapes."""
    return path.read_text().replace("\n", "\\n")
