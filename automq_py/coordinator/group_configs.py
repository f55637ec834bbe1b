"""Consumer group configs (KIP-848): the settings one consumer group's members get in place of
the broker's defaults, set on a GROUP resource (``kafka-configs --entity-type groups
--entity-name G --alter --add-config consumer.session.timeout.ms=50000``), as Kafka's
GroupConfigManager keeps them.

==============================  ==========================================  =================
group config                    broker default (DEFAULT_CONFIG synonym)     allowed range
==============================  ==========================================  =================
consumer.session.timeout.ms     group.consumer.session.timeout.ms           group.consumer.
                                                                            {min,max}.session.
                                                                            timeout.ms
consumer.heartbeat.interval.ms  group.consumer.heartbeat.interval.ms        group.consumer.
                                                                            {min,max}.heartbeat.
                                                                            interval.ms
==============================  ==========================================  =================

A group's configs are its own, whether or not the group exists yet (Kafka describes and sets
them for any group id); they are kept in the metadata store under ``group-config/<group id>``
(JSON) and act from the members' next heartbeat.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from automq_py.config import BrokerConfig
from storage.config_def import ConfigError
from storage.metadata.manager import MetadataManager

KV_PREFIX = "group-config/"


@dataclass(slots=True, frozen=True)
class GroupConfigKey:
    """A group config, the broker property that gives its default and those bounding it."""

    name: str
    default_property: str
    minimum_property: str
    maximum_property: str
    doc: str


SESSION_TIMEOUT = GroupConfigKey(
    "consumer.session.timeout.ms",
    "group.consumer.session.timeout.ms",
    "group.consumer.min.session.timeout.ms",
    "group.consumer.max.session.timeout.ms",
    "The timeout to detect client failures when using the consumer group protocol.",
)
HEARTBEAT_INTERVAL = GroupConfigKey(
    "consumer.heartbeat.interval.ms",
    "group.consumer.heartbeat.interval.ms",
    "group.consumer.min.heartbeat.interval.ms",
    "group.consumer.max.heartbeat.interval.ms",
    "The heartbeat interval given to the members.",
)
KEYS = {key.name: key for key in (SESSION_TIMEOUT, HEARTBEAT_INTERVAL)}


class GroupConfigs:
    """Every consumer group's own configs, over the broker's defaults."""

    def __init__(self, config: BrokerConfig, metadata: MetadataManager) -> None:
        self.metadata = metadata
        self._broker: dict[str, int] = {
            "group.consumer.session.timeout.ms": config.group_consumer_session_timeout_ms,
            "group.consumer.min.session.timeout.ms": config.group_consumer_min_session_timeout_ms,
            "group.consumer.max.session.timeout.ms": config.group_consumer_max_session_timeout_ms,
            "group.consumer.heartbeat.interval.ms": config.group_consumer_heartbeat_interval_ms,
            "group.consumer.min.heartbeat.interval.ms": (
                config.group_consumer_min_heartbeat_interval_ms
            ),
            "group.consumer.max.heartbeat.interval.ms": (
                config.group_consumer_max_heartbeat_interval_ms
            ),
        }
        self._static = {
            key.default_property
            for key in KEYS.values()
            if key.default_property in config.properties
        }

    def own(self, group_id: str) -> dict[str, str]:
        """The configs set on ``group_id`` (none by default)."""
        raw = self.metadata.image.kv.get(KV_PREFIX + group_id)
        if raw is None:
            return {}
        return {str(k): str(v) for k, v in json.loads(raw).items()}

    def timeouts(self, group_id: str) -> tuple[int, int]:
        """The group's session timeout and heartbeat interval (ms): its own values, else the
        broker's defaults."""
        own = self.own(group_id)
        return (
            int(own.get(SESSION_TIMEOUT.name, self._broker[SESSION_TIMEOUT.default_property])),
            int(
                own.get(HEARTBEAT_INTERVAL.name, self._broker[HEARTBEAT_INTERVAL.default_property])
            ),
        )

    def broker_default(self, key: GroupConfigKey) -> tuple[str, bool]:
        """The broker's default of ``key`` and whether its properties set it (else the
        property's own default)."""
        return str(self._broker[key.default_property]), key.default_property in self._static

    def validate(self, configs: Mapping[str, str]) -> dict[str, int]:
        """``configs`` (a group's whole set) checked as Kafka's GroupConfig.validate checks
        them; raises ConfigError with Kafka's message."""
        values: dict[str, int] = {}
        for name, text in configs.items():
            key = KEYS.get(name)
            if key is None:
                raise ConfigError(f"Unknown group config name: {name}")
            try:
                value = int(text)
            except ValueError:
                raise ConfigError(
                    f"Invalid value {text} for configuration {name}: Not a number of type INT"
                ) from None
            low, high = self._broker[key.minimum_property], self._broker[key.maximum_property]
            if not low <= value <= high:
                raise ConfigError(f"{name} must be in the range {low} to {high} inclusive.")
            values[name] = value
        session = values.get(SESSION_TIMEOUT.name, self._broker[SESSION_TIMEOUT.default_property])
        interval = values.get(
            HEARTBEAT_INTERVAL.name, self._broker[HEARTBEAT_INTERVAL.default_property]
        )
        if interval >= session:
            raise ConfigError(f"{HEARTBEAT_INTERVAL.name} must be less than {SESSION_TIMEOUT.name}")
        return values

    async def alter(self, group_id: str, configs: Mapping[str, str]) -> None:
        """Validate ``configs`` and make them group ``group_id``'s whole set."""
        self.validate(configs)
        key = KV_PREFIX + group_id
        if configs:
            stored = {name: configs[name] for name in sorted(configs)}
            await self.metadata.put_kv(key, json.dumps(stored).encode())
        elif key in self.metadata.image.kv:
            await self.metadata.delete_kv(key)
