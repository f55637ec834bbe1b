"""Dynamic broker configs: which properties may change, for which broker resource, and
``advertised.listeners`` held to what a Kafka 3.9 KRaft broker accepts, with its messages (each
checked against a Kafka 3.9.0 broker)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from automq_py.config import BrokerConfig
from automq_py.dynamic_config import (
    DynamicBrokerConfig,
    ReadOnlyConfigError,
    RefusedConfigError,
    check_advertised_listeners,
)

CONFIG = BrokerConfig.from_properties({"listeners": "PLAINTEXT://127.0.0.1:9092"})


def dynamic() -> DynamicBrokerConfig:
    metadata: Any = SimpleNamespace(image=SimpleNamespace(kv={}))  # nothing stored yet
    return DynamicBrokerConfig(CONFIG, metadata)


@pytest.mark.parametrize(
    "value",
    ["PLAINTEXT://127.0.0.1:9092", "plaintext://127.0.0.1:9092", " PLAINTEXT://127.0.0.1:9092 "],
)
def test_the_registered_endpoints_are_accepted_however_written(value: str) -> None:
    check_advertised_listeners(CONFIG, value)
    assert dynamic().validate("0", {"advertised.listeners": value}) is not None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "PLAINTEXT://localhost:9092",
            "Invalid value org.apache.kafka.common.config.ConfigException: Advertised listeners "
            "cannot be altered when using a Raft-based metadata quorum. for configuration "
            "Invalid dynamic configuration",
        ),
        (
            "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:1",
            "requirement failed: advertised.listeners listener names must be equal to or a "
            "subset of the ones defined in listeners. Found PLAINTEXT,SSL. The valid options "
            "based on the current configuration are PLAINTEXT",
        ),
        (
            "SSL://127.0.0.1:9092",
            "requirement failed: inter.broker.listener.name must be a listener name defined in "
            "advertised.listeners. The valid options based on currently configured listeners "
            "are SSL",
        ),
        (
            "PLAINTEXT://0.0.0.0:9092",
            "requirement failed: advertised.listeners cannot use the nonroutable meta-address "
            "0.0.0.0. Use a routable IP address.",
        ),
        ("garbage", "Error creating broker listeners from 'garbage': advertised.listeners: "),
    ],
)
def test_other_values_are_refused_with_kafkas_messages(value: str, message: str) -> None:
    with pytest.raises(RefusedConfigError) as refused:
        check_advertised_listeners(CONFIG, value)
    assert str(refused.value).startswith(message)


def test_only_one_broker_may_set_them() -> None:
    with pytest.raises(RefusedConfigError) as refused:
        dynamic().validate("", {"advertised.listeners": "PLAINTEXT://127.0.0.1:9092"})
    assert str(refused.value) == (
        "Cannot update these configs at default cluster level, broker id must be specified: "
        "Set(advertised.listeners)"
    )
    # a read-only property is named first, as Kafka checks it first
    with pytest.raises(ReadOnlyConfigError, match=r"^Cannot update these configs dynamically"):
        dynamic().validate("", {"advertised.listeners": "x", "listeners": "x"})
