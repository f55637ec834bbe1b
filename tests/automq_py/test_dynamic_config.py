"""Dynamic broker configs: which properties may change, for which broker resource, and
``advertised.listeners`` held to what a Kafka 3.9 KRaft broker accepts, with its messages (each
checked against a Kafka 3.9.0 broker)."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from automq_py.config import BrokerConfig
from automq_py.dynamic_config import (
    DYNAMIC,
    DynamicBrokerConfig,
    ReadOnlyConfigError,
    RefusedConfigError,
    check_advertised_listeners,
)
from storage.config_def import ConfigError

CONFIG = BrokerConfig.from_properties({"listeners": "PLAINTEXT://127.0.0.1:9092"})


class StoredConfigs:
    """The metadata store's side: its KV image and the listeners told of a change."""

    def __init__(self) -> None:
        self.image = SimpleNamespace(kv={})  # nothing stored yet
        self.listeners: list[tuple[str, Callable[[], None]]] = []

    def add_kv_listener(self, prefix: str, listener: Callable[[], None]) -> None:
        self.listeners.append((prefix, listener))

    def put(self, key: str, configs: dict[str, str]) -> None:
        """``configs`` stored under ``key``, as another broker of the cluster stores them."""
        self.image.kv[key] = json.dumps(configs).encode()
        for prefix, listener in self.listeners:
            if key.startswith(prefix):
                listener()


def dynamic(metadata: StoredConfigs | None = None) -> DynamicBrokerConfig:
    store: Any = metadata or StoredConfigs()
    return DynamicBrokerConfig(CONFIG, store)


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


def test_the_cleaner_backoff_changes_at_run_time_as_in_kafka() -> None:
    """``log.cleaner.backoff.ms`` is one of Kafka's LogCleaner.ReconfigurableConfigs: dynamic
    for one broker or the cluster, held to its minimum, read by the next key compaction check."""
    assert "log.cleaner.backoff.ms" in DYNAMIC
    store = StoredConfigs()
    configs = dynamic(store)
    assert configs.cleaner_backoff_ms() == 15_000
    configs.validate("0", {"log.cleaner.backoff.ms": "20000"})
    with pytest.raises(ConfigError, match=r"log\.cleaner\.backoff\.ms"):
        configs.validate("", {"log.cleaner.backoff.ms": "-1"})
    store.put("broker-config/", {"log.cleaner.backoff.ms": "500"})
    assert configs.cleaner_backoff_ms() == 500


def test_configs_stored_through_another_broker_take_effect_here() -> None:
    """In a cluster the dynamic configs follow the store: a cluster-wide default set through
    another broker is in effect here at once, and listeners hear of it; a change stored for
    another broker is not this one's."""
    store = StoredConfigs()
    configs = dynamic(store)
    heard: list[dict[str, str]] = []
    configs.add_listener(lambda: heard.append(configs.topic_defaults()))
    store.put("broker-config/", {"log.retention.ms": "60000"})
    assert configs.layers().dynamic_default == {"log.retention.ms": "60000"}
    assert [d["retention.ms"] for d in heard] == ["60000"]
    store.put("broker-config/7", {"log.retention.ms": "1000"})
    assert configs.layers().dynamic_broker == {}
    assert len(heard) == 1
