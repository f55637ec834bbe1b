"""The BROKER_LOGGER config resource (KIP-412): the broker's loggers and their levels in log4j's
words, described and changed while it runs. The planner and the level table are tested on a
private ``logging.Manager``; the broker with Kafka's ``kafka-configs`` (describe, a level set to
DEBUG that the broker's log shows at once, a delete that takes it back, the refusals) and with
raw requests. Every error code and message is the one a Kafka 3.9.0 broker answered to the same
request (its logger ``kafka`` in place of ours)."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from automq_py.apis.broker_loggers import (
    BrokerLoggerError,
    LevelChange,
    apply,
    describe,
    log4j_level,
    plan_alter,
    refuse_legacy_alter,
)
from protocol.errors import ErrorCode
from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess
from tests.support.java import ToolRun, ToolRunner
from tests.support.raw_connection import RawConnection
from tests.support.seaweedfs import SeaweedFS

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
VALID = "Valid log levels are DEBUG, ERROR, FATAL, INFO, TRACE, WARN"


def private_manager(*names: str, **levels: int) -> logging.Manager:
    """A logging hierarchy of its own (root at INFO) with loggers ``names``, and ``levels`` set
    by name (dots as double underscores)."""
    manager = logging.Manager(logging.RootLogger(logging.INFO))
    for name in names:
        manager.getLogger(name)
    for name, level in levels.items():
        manager.getLogger(name.replace("__", ".")).setLevel(level)
    return manager


@pytest.mark.parametrize(
    ("level", "log4j"),
    [
        (logging.CRITICAL + 10, "OFF"),
        (logging.CRITICAL, "FATAL"),
        (logging.ERROR, "ERROR"),
        (logging.WARNING, "WARN"),
        (logging.INFO, "INFO"),
        (logging.DEBUG, "DEBUG"),
        (5, "TRACE"),
        (1, "ALL"),
        (15, "INFO"),  # lets INFO through, not DEBUG
        (45, "FATAL"),
    ],
)
def test_python_levels_are_named_in_log4js_words(level: int, log4j: str) -> None:
    assert log4j_level(level) == log4j


def test_describe_lists_root_and_every_logger_with_the_level_it_inherits() -> None:
    manager = private_manager("a.b.c", "x", a=logging.DEBUG, x__y=logging.WARNING)
    entries = describe(0, "0", manager)
    # "a.b" is only a placeholder between a and a.b.c: not a logger
    assert [(e["name"], e["value"]) for e in entries] == [
        ("root", "INFO"),
        ("a", "DEBUG"),
        ("a.b.c", "DEBUG"),
        ("x", "INFO"),
        ("x.y", "WARN"),
    ]
    # Kafka 3.9.0's entry: a dynamic broker logger config, no type, synonyms or documentation
    assert entries[0] == {
        "name": "root",
        "value": "INFO",
        "read_only": False,
        "config_source": 6,
        "is_sensitive": False,
        "synonyms": [],
        "config_type": 0,
        "documentation": "",
    }


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "Broker id must not be empty"),
        ("1", "Unexpected broker id, expected 0 but received 1"),
        ("abc", "Broker id must be an integer, but it is: abc"),
        (" 0", "Broker id must be an integer, but it is:  0"),
        ("2147483648", "Broker id must be an integer, but it is: 2147483648"),
    ],
)
def test_describe_of_another_broker_is_refused(name: str, message: str) -> None:
    with pytest.raises(BrokerLoggerError) as e:
        describe(0, name, private_manager())
    assert (e.value.code, e.value.message) == (ErrorCode.INVALID_REQUEST, message)


BAD_LEVEL = "Cannot set the log level of a to {} as it is not a supported log level. " + VALID


@pytest.mark.parametrize(
    ("name", "ops", "authorized", "code", "message"),
    [
        # names and values first, for any resource; then the cluster authorization
        (
            "0",
            [("a", SET, "DEBUG"), ("a", SET, "INFO")],
            False,
            42,
            "Error due to duplicate config keys",
        ),
        (
            "0",
            [("nope", SET, "DEBUG"), ("a", SET, None)],
            False,
            42,
            "Null value not supported for : a",
        ),
        ("0", [("a", SET, "DEBUG")], False, 31, "Cluster authorization failed."),
        ("abc", [("a", SET, "DEBUG")], True, 42, "Node id must be an integer, but it is: abc"),
        ("", [("a", SET, "DEBUG")], True, 42, "Node id must be an integer, but it is: "),
        ("5", [("a", APPEND, "x")], True, 42, "Unexpected node id. Expected 0, but received 5"),
        # then each operation in turn: the first refused answers
        ("0", [("no.such", SET, "DEBUG")], True, 40, "Logger no.such does not exist!"),
        ("0", [("no.such", DELETE, None)], True, 40, "Logger no.such does not exist!"),
        ("0", [("a", SET, "VERBOSE")], True, 40, BAD_LEVEL.format("VERBOSE")),
        ("0", [("a", SET, "debug")], True, 40, BAD_LEVEL.format("debug")),
        ("0", [("a", SET, "")], True, 40, BAD_LEVEL.format("")),
        ("0", [("a", SET, "OFF")], True, 40, BAD_LEVEL.format("OFF")),
        ("0", [("a", SET, "ALL")], True, 40, BAD_LEVEL.format("ALL")),
        ("0", [("a", SET, "x"), ("no.such", SET, "DEBUG")], True, 40, BAD_LEVEL.format("x")),
        (
            "0",
            [("a", SET, "DEBUG"), ("no.such", SET, "DEBUG")],
            True,
            40,
            "Logger no.such does not exist!",
        ),
        (
            "0",
            [("root", DELETE, None)],
            True,
            42,
            "Removing the log level of the root logger is not allowed",
        ),
        (
            "0",
            [("a", APPEND, "DEBUG")],
            True,
            42,
            "APPEND operation is not allowed for the BROKER_LOGGER resource",
        ),
        (
            "0",
            [("a", SUBTRACT, "DEBUG")],
            True,
            42,
            "SUBTRACT operation is not allowed for the BROKER_LOGGER resource",
        ),
        # an operation id with no name: Kafka fails with no message
        ("0", [("no.such", 7, "DEBUG")], True, -1, None),
    ],
)
def test_alter_refusals_are_kafkas(
    name: str, ops: list[Any], authorized: bool, code: int, message: str | None
) -> None:
    exists = {"root", "a"}.__contains__
    with pytest.raises(BrokerLoggerError) as e:
        plan_alter(0, name, ops, authorized, exists)
    assert (e.value.code, e.value.message) == (code, message)


def test_set_and_delete_change_the_levels_at_once() -> None:
    manager = private_manager("a", "a.b")
    exists = {"root", "a", "a.b"}.__contains__
    ops = [("a", SET, "TRACE"), ("a.b", SET, "FATAL"), ("root", SET, "WARN"), ("x", DELETE, "junk")]
    with pytest.raises(BrokerLoggerError):  # "x" does not exist: nothing changes
        plan_alter(0, "0", ops, True, exists)
    changes = plan_alter(0, "0", ops[:3], True, exists)
    assert changes == [
        LevelChange("a", "TRACE"),
        LevelChange("a.b", "FATAL"),
        LevelChange("root", "WARN"),
    ]
    apply(changes, manager)
    assert [(e["name"], e["value"]) for e in describe(0, "0", manager)] == [
        ("root", "WARN"),
        ("a", "TRACE"),
        ("a.b", "FATAL"),
    ]
    assert manager.getLogger("a").isEnabledFor(5) and not manager.getLogger("a.b").isEnabledFor(40)
    # DELETE (a value given or not): the logger inherits again
    apply(plan_alter(0, "0", [("a.b", DELETE, "junk"), ("a", DELETE, None)], True, exists), manager)
    assert {e["name"]: e["value"] for e in describe(0, "0", manager)} == {
        "root": "WARN",
        "a": "WARN",
        "a.b": "WARN",
    }


def test_legacy_alter_configs_refuses_the_resource_type() -> None:
    assert _error(refuse_legacy_alter([("a", "DEBUG")])) == (42, "Unknown resource type 8")
    assert _error(refuse_legacy_alter([("a", None)])) == (42, "Null value not supported for : a")
    assert _error(refuse_legacy_alter([("a", "DEBUG"), ("a", "INFO")])) == (
        42,
        "Error due to duplicate config keys",
    )


def _error(e: BrokerLoggerError) -> tuple[int, str | None]:
    return e.code, e.message


# -- against the broker ------------------------------------------------------------------------

LOGGER = "automq_py.log.elastic_log"  # logs each segment roll at DEBUG


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    with module_broker(tmp_path_factory, s3_server, **{"log.level.automq.network": "WARNING"}) as b:
        yield b


@pytest.fixture(scope="module")
def tools(broker: BrokerProcess) -> Iterator[ToolRunner]:
    runner = ToolRunner(Path(broker.data_dir.parent) / "tool-runner.log")
    try:
        yield runner
    finally:
        runner.close()


def kafka_configs(tools: ToolRunner, broker: BrokerProcess, *args: str) -> ToolRun:
    return tools.run(
        "kafka-configs",
        "--bootstrap-server",
        broker.bootstrap,
        "--entity-type",
        "broker-loggers",
        "--entity-name",
        "0",
        *args,
        check=False,
    )


def levels(tools: ToolRunner, broker: BrokerProcess) -> dict[str, str]:
    """``kafka-configs --describe``'s loggers and levels."""
    run = kafka_configs(tools, broker, "--describe")
    assert run.returncode == 0, run.stderr
    assert run.lines()[0] == "Dynamic configs for broker-logger 0 are:"
    entry = re.compile(r"  (\S+)=(\S+) sensitive=false synonyms=\{\}")
    found = [entry.fullmatch(line) for line in run.lines()[1:]]
    assert all(found), run.stdout
    return {m.group(1): m.group(2) for m in found if m}


@pytest.mark.integration
def test_kafka_configs_describes_every_logger(broker: BrokerProcess, tools: ToolRunner) -> None:
    described = levels(tools, broker)
    # log.level.automq.network=WARNING at start; its child inherits it, the rest the root's
    assert described["root"] == "INFO"
    assert described["automq.network"] == "WARN"
    assert described["automq.network.sasl"] == "WARN"
    assert described["automq.broker"] == described[LOGGER] == "INFO"
    assert set(described.values()) <= {"FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"}


@pytest.mark.integration
def test_a_level_set_acts_at_once_and_delete_takes_it_back(
    broker: BrokerProcess, tools: ToolRunner
) -> None:
    topic = f"loggers-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    # a segment per record: every append after the first rolls one
    for f in admin.create_topics([NewTopic(topic, 1, config={"segment.bytes": "14"})]).values():
        f.result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})

    def rolls_logged_after(records: int) -> int:
        for _ in range(records):
            producer.produce(topic, b"x" * 100)
            assert producer.flush(30) == 0
        return len(re.findall(rf"DEBUG {LOGGER}: rolled segment", broker.log_path.read_text()))

    assert rolls_logged_after(2) == 0

    run = kafka_configs(tools, broker, "--alter", "--add-config", f"{LOGGER}=DEBUG")
    assert run.returncode == 0, run.stderr
    assert run.lines() == ["Completed updating config for broker-logger 0."]
    assert levels(tools, broker)[LOGGER] == "DEBUG"
    assert rolls_logged_after(2) == 2
    assert f"WARNING automq.apis: Updated the log level of {LOGGER} to DEBUG" in _log(broker)

    run = kafka_configs(tools, broker, "--alter", "--delete-config", LOGGER)
    assert run.returncode == 0, run.stderr
    assert levels(tools, broker)[LOGGER] == "INFO"
    assert rolls_logged_after(2) == 2
    assert f"WARNING automq.apis: Unset the log level of {LOGGER}" in _log(broker)


def _log(broker: BrokerProcess) -> str:
    return broker.log_path.read_text(errors="replace")


@pytest.mark.integration
def test_kafka_configs_refusals(broker: BrokerProcess, tools: ToolRunner) -> None:
    # the tool checks the names against a describe first
    run = kafka_configs(tools, broker, "--alter", "--add-config", "no.such.logger=DEBUG")
    assert run.returncode == 1 and "Invalid broker logger(s): no.such.logger" in run.stderr
    run = kafka_configs(tools, broker, "--alter", "--add-config", f"{LOGGER}=debug")
    assert run.returncode == 1
    assert (
        "InvalidConfigurationException: Cannot set the log level of "
        f"{LOGGER} to debug as it is not a supported log level. {VALID}"
    ) in run.stderr
    run = kafka_configs(tools, broker, "--alter", "--delete-config", "root")
    assert run.returncode == 1
    assert (
        "InvalidRequestException: Removing the log level of the root logger is not allowed"
        in run.stderr
    )


@pytest.mark.integration
def test_raw_answers(broker: BrokerProcess) -> None:
    conn = RawConnection(broker.bootstrap)
    try:

        def alter(name: str, ops: list[Any], validate_only: bool = False) -> tuple[int, Any]:
            a = IncrementalAlterConfigsRequest.AlterConfigsResource
            request = IncrementalAlterConfigsRequest[1](
                resources=[
                    a(
                        resource_type=8,
                        resource_name=name,
                        configs=[
                            a.AlterableConfig(name=n, config_operation=o, value=v)
                            for n, o, v in ops
                        ],
                    )
                ],
                validate_only=validate_only,
            )
            (r,) = conn.call(request, IncrementalAlterConfigsResponse).responses
            return r.error_code, r.error_message

        def described(name: str) -> Any:
            request = DescribeConfigsRequest[4](
                resources=[
                    DescribeConfigsRequest.DescribeConfigsResource(
                        resource_type=8, resource_name=name, configuration_keys=["root", "nope"]
                    )
                ],
                include_synonyms=True,
                include_documentation=True,
            )
            (r,) = conn.call(request, DescribeConfigsResponse).results
            return r.error_code, r.error_message, [(c.name, c.value) for c in r.configs]

        assert described("0") == (0, "", [("root", "INFO")])
        assert described("1") == (42, "Unexpected broker id, expected 0 but received 1", [])
        assert alter("0", [("root", SET, "ERROR")], validate_only=True) == (0, None)
        assert described("0") == (0, "", [("root", "INFO")])
        assert alter("0", [("root", SUBTRACT, "INFO")]) == (
            42,
            "SUBTRACT operation is not allowed for the BROKER_LOGGER resource",
        )
        a = AlterConfigsRequest.AlterConfigsResource
        legacy = AlterConfigsRequest[1](
            resources=[
                a(
                    resource_type=8,
                    resource_name="0",
                    configs=[a.AlterableConfig(name="root", value="DEBUG")],
                )
            ],
            validate_only=False,
        )
        (r,) = conn.call(legacy, AlterConfigsResponse).responses
        assert (r.error_code, r.error_message) == (42, "Unknown resource type 8")
    finally:
        conn.close()


@pytest.mark.integration
def test_kafka_python_describes_broker_loggers(broker: BrokerProcess) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        resource = ConfigResource(ConfigResourceType.BROKER_LOGGER, "0")
        described = admin.describe_configs([resource], config_filter="all")["broker_logger"]["0"]
    finally:
        admin.close()
    assert described["automq.network"] == {
        "value": "WARN",
        "read_only": False,
        "config_source": "DYNAMIC_BROKER_LOGGER_CONFIG",
        "is_sensitive": False,
        "synonyms": [],
        "config_type": "UNKNOWN",
        "documentation": "",
    }
    assert described["root"]["value"] == "INFO"
