"""A topic's effective configuration: the broker's defaults for topic properties with the topic's
own configs over them (Kafka's ``LogConfig.fromProps(defaults, overrides)``).

:func:`effective_topic_config` is the one place the two are merged, and every reader of a
topic's settings goes through it, so none can see another value: the partitions
(``ReplicaManager.log_config``), CreateTopics and AlterConfigs (validation), DescribeConfigs,
and retention (DescribeLogSegments hands the maintenance jobs the partitions' ``retention.ms``,
``retention.bytes`` and ``cleanup.policy``). The group coordinator's ``__consumer_offsets``
settings are stored as that topic's own configs and merged the same way.

For DescribeConfigs, :meth:`TopicConfig.describe` says where each value comes from, as Kafka
reports it: the topic's own (DYNAMIC_TOPIC_CONFIG), a broker property set in the broker's
configuration (STATIC_BROKER_CONFIG) or the broker property's default (DEFAULT_CONFIG).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from types import MappingProxyType

from automq_py.config import TOPIC_CONFIG_SYNONYMS, BrokerConfig, default_properties
from automq_py.log.log_config import LogConfig
from storage.config_def import ConfigType, format_value


class ConfigSource(IntEnum):
    """Where a config's value comes from (DescribeConfigs' ``config_source``)."""

    DYNAMIC_TOPIC_CONFIG = 1
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


@dataclass(slots=True, frozen=True)
class ConfigSynonym:
    """One property that sets a config, with its value and source."""

    name: str
    value: str
    source: ConfigSource


@dataclass(slots=True, frozen=True)
class DescribedConfig:
    """A topic config as DescribeConfigs reports it."""

    name: str
    value: str
    source: ConfigSource
    # every property that sets it, highest precedence first: the first one is in effect
    synonyms: tuple[ConfigSynonym, ...]
    type: ConfigType
    doc: str


@dataclass(slots=True, frozen=True)
class TopicConfig:
    """A topic's settings in effect, and the topic's own configs they were merged from."""

    log_config: LogConfig
    overrides: Mapping[str, str]

    def value(self, name: str) -> str:
        """The value in effect of topic property ``name``, as a property string."""
        attr, _ = LogConfig.properties()[name]
        return format_value(getattr(self.log_config, attr))

    def describe(self, broker: BrokerConfig) -> list[DescribedConfig]:
        """Every topic property with its value in effect and where it comes from; ``broker``
        is the configuration the defaults were taken from."""
        defaults = default_properties()
        out = []
        for name, (attr, key) in LogConfig.properties().items():
            broker_names = TOPIC_CONFIG_SYNONYMS.get(name, ())
            chain: list[ConfigSynonym] = []
            if name in self.overrides:
                chain.append(
                    ConfigSynonym(name, self.overrides[name], ConfigSource.DYNAMIC_TOPIC_CONFIG)
                )
            chain += [
                ConfigSynonym(b, broker.properties[b], ConfigSource.STATIC_BROKER_CONFIG)
                for b in broker_names
                if b in broker.properties
            ]
            # Kafka names the default after the broker property it is written as
            # (log.retention.hours), the last synonym that has one
            default_name = next((b for b in reversed(broker_names) if b in defaults), None)
            if default_name is None:
                chain.append(
                    ConfigSynonym(name, format_value(key.default), ConfigSource.DEFAULT_CONFIG)
                )
            else:
                chain.append(
                    ConfigSynonym(default_name, defaults[default_name], ConfigSource.DEFAULT_CONFIG)
                )
            value = format_value(getattr(self.log_config, attr))
            out.append(
                DescribedConfig(name, value, chain[0].source, tuple(chain), key.type, key.doc)
            )
        return out


def effective_topic_config(
    defaults: Mapping[str, str], overrides: Mapping[str, str], *, strict: bool = False
) -> TopicConfig:
    """The settings of a topic whose own configs are ``overrides``, over the broker's
    ``defaults`` (:meth:`BrokerConfig.topic_defaults`). With ``strict`` an unknown topic
    property is refused (CreateTopics, AlterConfigs). Raises ConfigError naming the property."""
    log_config = LogConfig.from_properties({**defaults, **overrides}, strict=strict)
    return TopicConfig(log_config, MappingProxyType(dict(overrides)))
