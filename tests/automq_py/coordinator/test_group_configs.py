"""Consumer group configs (KIP-848): a group's own consumer.session.timeout.ms and
consumer.heartbeat.interval.ms, checked as Kafka's GroupConfig checks them, set and described
on a GROUP resource, and given to the group's members in their heartbeats."""

from __future__ import annotations

import time
import uuid
from typing import Any, cast

import pytest

from automq_py.config import BrokerConfig
from automq_py.coordinator.group_configs import GroupConfigs
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from storage.config_def import ConfigError
from storage.metadata.manager import MetadataManager
from tests.automq_py.conftest import MakeBroker
from tests.automq_py.coordinator.test_group_errors import (
    TOPIC,
    call,
    consumer_heartbeat,
    with_orders_topic,
)
from tests.support.broker import BrokerProcess

GROUP = 32  # ConfigResource.Type.GROUP
SET, DELETE = 0, 1
DYNAMIC_GROUP_CONFIG, DEFAULT_CONFIG = 8, 5


def configs() -> GroupConfigs:
    # validate() reads the broker's properties only
    return GroupConfigs(BrokerConfig(), cast(MetadataManager, None))


def test_values_inside_kafkas_bounds_pass() -> None:
    assert configs().validate(
        {"consumer.session.timeout.ms": "50000", "consumer.heartbeat.interval.ms": "6000"}
    ) == {"consumer.session.timeout.ms": 50000, "consumer.heartbeat.interval.ms": 6000}
    assert configs().validate({}) == {}


@pytest.mark.parametrize(
    ("configs_given", "message"),
    [
        (
            {"consumer.session.timeout.ms": "5"},
            "consumer.session.timeout.ms must be in the range 45000 to 60000 inclusive.",
        ),
        (
            {"consumer.heartbeat.interval.ms": "20000"},
            "consumer.heartbeat.interval.ms must be in the range 5000 to 15000 inclusive.",
        ),
        (
            {"consumer.session.timeout.ms": "soon"},
            "Invalid value soon for configuration consumer.session.timeout.ms: "
            "Not a number of type INT",
        ),
        ({"session.timeout.ms": "50000"}, "Unknown group config name: session.timeout.ms"),
    ],
)
def test_kafkas_messages_for_what_it_refuses(configs_given: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        configs().validate(configs_given)
    assert str(refused.value) == message


def test_the_heartbeat_must_come_within_the_session_timeout() -> None:
    broker = BrokerConfig.from_properties(
        {
            "group.consumer.min.session.timeout.ms": "1000",
            "group.consumer.session.timeout.ms": "8000",
        }
    )
    with pytest.raises(ConfigError, match=r"must be less than consumer\.session\.timeout\.ms"):
        GroupConfigs(broker, cast(MetadataManager, None)).validate(
            {"consumer.session.timeout.ms": "5000"}
        )


def alter(b: BrokerProcess, group: str, *ops: tuple[str, int, str | None]) -> Any:
    resource = {
        "resource_type": GROUP,
        "resource_name": group,
        "configs": [{"name": n, "config_operation": op, "value": v} for n, op, v in ops],
    }
    response = call(
        b, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [resource], "validate_only": False}
    )
    [result] = response.responses
    return result


def describe(b: BrokerProcess, group: str) -> dict[str, tuple[str, int, list[tuple[str, int]]]]:
    resource = {"resource_type": GROUP, "resource_name": group, "configuration_keys": None}
    response = call(
        b, ApiKey.DESCRIBE_CONFIGS, 4, {"resources": [resource], "include_synonyms": True}
    )
    [result] = response.results
    assert result.error_code == ErrorCode.NONE, result.error_message
    return {
        c.name: (c.value, c.config_source, [(s.name, s.source) for s in c.synonyms])
        for c in result.configs
    }


@pytest.mark.integration
def test_a_groups_configs_are_set_described_and_given_to_its_members(
    make_broker: MakeBroker,
) -> None:
    """Any group id has the two configs, from the broker's defaults; a group's own values show
    as DYNAMIC_GROUP_CONFIG over them, a value out of bounds is INVALID_CONFIG, and a member's
    heartbeat gets the group's interval."""
    b = with_orders_topic(make_broker(**{"group.initial.rebalance.delay.ms": "0"}))
    assert describe(b, "fresh") == {
        "consumer.session.timeout.ms": (
            "45000",
            DEFAULT_CONFIG,
            [("group.consumer.session.timeout.ms", DEFAULT_CONFIG)],
        ),
        "consumer.heartbeat.interval.ms": (
            "5000",
            DEFAULT_CONFIG,
            [("group.consumer.heartbeat.interval.ms", DEFAULT_CONFIG)],
        ),
    }

    assert (
        alter(b, "tuned", ("consumer.heartbeat.interval.ms", SET, "7000")).error_code
        == ErrorCode.NONE
    )
    tuned = describe(b, "tuned")["consumer.heartbeat.interval.ms"]
    assert tuned == (
        "7000",
        DYNAMIC_GROUP_CONFIG,
        [
            ("consumer.heartbeat.interval.ms", DYNAMIC_GROUP_CONFIG),
            ("group.consumer.heartbeat.interval.ms", DEFAULT_CONFIG),
        ],
    )
    refused = alter(b, "tuned", ("consumer.session.timeout.ms", SET, "100"))
    assert refused.error_code == ErrorCode.INVALID_CONFIG
    assert "must be in the range 45000 to 60000" in refused.error_message

    member = str(uuid.uuid4())
    joined = consumer_heartbeat(b, "tuned", member, 0, topics=[TOPIC])
    assert (joined.error_code, joined.heartbeat_interval.total_seconds()) == (ErrorCode.NONE, 7.0)
    other = consumer_heartbeat(b, "untuned", str(uuid.uuid4()), 0, topics=[TOPIC])
    assert other.heartbeat_interval.total_seconds() == 5.0

    assert (
        alter(b, "tuned", ("consumer.heartbeat.interval.ms", DELETE, None)).error_code
        == ErrorCode.NONE
    )
    assert describe(b, "tuned")["consumer.heartbeat.interval.ms"][:2] == ("5000", DEFAULT_CONFIG)
    assert consumer_heartbeat(b, "tuned", member, 1).heartbeat_interval.total_seconds() == 5.0


@pytest.mark.integration
def test_a_groups_own_session_timeout_expires_its_members(make_broker: MakeBroker) -> None:
    """A member of a group whose own session timeout is 2 s (the broker allowing it) is gone
    2 s after its last heartbeat, though the broker's default is 45 s."""
    b = with_orders_topic(
        make_broker(
            **{
                "group.initial.rebalance.delay.ms": "0",
                "group.consumer.min.session.timeout.ms": "1000",
                "group.consumer.min.heartbeat.interval.ms": "500",
            }
        )
    )
    ops = [
        ("consumer.session.timeout.ms", SET, "2000"),
        ("consumer.heartbeat.interval.ms", SET, "500"),
    ]
    assert alter(b, "brief", *ops).error_code == ErrorCode.NONE
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    consumer_heartbeat(b, "brief", first, 0, topics=[TOPIC])
    epoch = consumer_heartbeat(b, "brief", second, 0, topics=[TOPIC]).member_epoch
    # only the second keeps heartbeating: the first is fenced out once its session is over
    deadline = time.monotonic() + 15
    while True:
        beat = consumer_heartbeat(b, "brief", second, epoch)
        assert beat.error_code == ErrorCode.NONE
        epoch = beat.member_epoch
        owned = (
            sum(len(t.partitions) for t in beat.assignment.topic_partitions)
            if beat.assignment
            else None
        )
        if owned == 2:
            break
        assert time.monotonic() < deadline, "the silent member was never expired"
        time.sleep(0.3)
    assert consumer_heartbeat(b, "brief", first, 1).error_code == ErrorCode.UNKNOWN_MEMBER_ID
