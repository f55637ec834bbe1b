"""A topic's effective configuration: the broker's defaults for topic properties with the topic's
own configs over them (Kafka's ``LogConfig.fromProps(defaults, overrides)``).

:func:`effective_topic_config` is the one place the two are merged, and every reader of a
topic's settings goes through it, so none can see another value: the partitions
(``ReplicaManager.log_config``), CreateTopics and AlterConfigs (validation), DescribeConfigs,
and retention (DescribeLogSegments hands the maintenance jobs the partitions' ``retention.ms``,
``retention.bytes`` and ``cleanup.policy``). The group coordinator's ``__consumer_offsets``
settings are stored as that topic's own configs and merged the same way.

For DescribeConfigs, :meth:`TopicConfig.describe` and :meth:`ConfigLayers.synonyms` say where
each value comes from, as Kafka reports it: the topic's own (DYNAMIC_TOPIC_CONFIG), a broker
property set dynamically for this broker (DYNAMIC_BROKER_CONFIG) or for all
(DYNAMIC_DEFAULT_BROKER_CONFIG), in the broker's properties (STATIC_BROKER_CONFIG), or the
broker property's default (DEFAULT_CONFIG).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from types import MappingProxyType

from automq_py.config import TOPIC_CONFIG_SYNONYMS, BrokerConfig, default_properties
from automq_py.log.log_config import LogConfig
from storage.config_def import ConfigError, ConfigType, declared_keys, format_value


class ConfigSource(IntEnum):
    """Where a config's value comes from (DescribeConfigs' ``config_source``)."""

    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_GROUP_CONFIG = 8


@dataclass(slots=True, frozen=True)
class ConfigSynonym:
    """One property that sets a config, with its value and source."""

    name: str
    value: str | None
    source: ConfigSource


@dataclass(slots=True, frozen=True)
class ConfigLayers:
    """The broker's property sources, highest precedence first: this broker's dynamic configs,
    the cluster-wide dynamic defaults, the properties it was started with, and the defaults."""

    dynamic_broker: Mapping[str, str]
    dynamic_default: Mapping[str, str]
    static: Mapping[str, str]
    defaults: Mapping[str, str]

    @classmethod
    def of(cls, broker: BrokerConfig) -> ConfigLayers:
        """A broker's layers with no dynamic configs."""
        return cls({}, {}, broker.properties, default_properties())

    def merged(self) -> dict[str, str]:
        """The properties in effect (without the defaults)."""
        return {**self.static, **self.dynamic_default, **self.dynamic_broker}

    def synonyms(self, name: str) -> list[ConfigSynonym]:
        """Every value that sets broker property ``name``, as Kafka's ConfigHelper lists them:
        each source in precedence order, within it each name of ``name``'s group
        (``log.retention.ms``, ``.minutes``, ``.hours``); then the ones before the first entry
        named ``name`` are dropped, so a property is never shown a higher-precedence
        synonym's value (``log.retention.hours`` does not list ``log.retention.ms``)."""
        names = broker_synonym_group(name)
        out = [
            ConfigSynonym(n, layer[n], source)
            for source, layer in (
                (ConfigSource.DYNAMIC_BROKER_CONFIG, self.dynamic_broker),
                (ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, self.dynamic_default),
                (ConfigSource.STATIC_BROKER_CONFIG, self.static),
                (ConfigSource.DEFAULT_CONFIG, self.defaults),
            )
            for n in names
            if n in layer
        ]
        while out and out[0].name != name:
            out.pop(0)
        return out


def broker_synonym_group(name: str) -> tuple[str, ...]:
    """The broker properties that set the same value as ``name``, in precedence order
    (Kafka's ``DynamicBrokerConfig.brokerConfigSynonyms``): the group of a topic config with
    several broker synonyms, else ``name`` alone."""
    return _SYNONYM_GROUPS.get(name, (name,))


# broker property -> its group, for the topic configs with several broker synonyms
_SYNONYM_GROUPS: dict[str, tuple[str, ...]] = {
    synonym.name: tuple(s.name for s in synonyms)
    for synonyms in TOPIC_CONFIG_SYNONYMS.values()
    if len(synonyms) > 1
    for synonym in synonyms
}


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

    def describe(self, layers: ConfigLayers) -> list[DescribedConfig]:
        """Every topic property with its value in effect and where it comes from, as Kafka's
        ConfigHelper describes a topic: the topic's own value, then the synonyms of the
        first broker property behind the default (``layers``: the broker's sources). Kafka's
        rule has a quirk kept here: the synonyms of ``log.retention.ms`` start at
        ``log.retention.ms``, so a default set only as ``log.retention.hours`` is reported as
        DEFAULT_CONFIG with no synonym."""
        out = []
        for name, (attr, key) in LogConfig.properties().items():
            value = format_value(getattr(self.log_config, attr))
            chain: list[ConfigSynonym] = []
            if name in self.overrides:
                chain.append(ConfigSynonym(name, value, ConfigSource.DYNAMIC_TOPIC_CONFIG))
            broker_names = TOPIC_CONFIG_SYNONYMS.get(name, ())
            if broker_names:
                chain += layers.synonyms(broker_names[0].name)
            source = chain[0].source if chain else ConfigSource.DEFAULT_CONFIG
            out.append(DescribedConfig(name, value, source, tuple(chain), key.type, key.doc))
        return out


def effective_topic_config(
    defaults: Mapping[str, str], overrides: Mapping[str, str], *, strict: bool = False
) -> TopicConfig:
    """The settings of a topic whose own configs are ``overrides``, over the broker's
    ``defaults`` (:meth:`BrokerConfig.topic_defaults`). With ``strict`` an unknown topic
    property is refused (CreateTopics, AlterConfigs), in Kafka's words. Raises ConfigError
    naming the property."""
    if strict:
        known = declared_keys(LogConfig)
        unknown = next((name for name in overrides if name not in known), None)
        if unknown is not None:
            raise ConfigError(f"Unknown topic config name: {unknown}")
    log_config = LogConfig.from_properties({**defaults, **overrides}, strict=strict)
    return TopicConfig(log_config, MappingProxyType(dict(overrides)))
