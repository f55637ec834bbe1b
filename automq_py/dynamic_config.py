"""Dynamic broker configs: the broker properties AlterConfigs and IncrementalAlterConfigs set
on a broker resource, as Kafka's DynamicBrokerConfig keeps them.

A broker resource named by this broker's id holds its own configs (DYNAMIC_BROKER_CONFIG); the
one with the empty name holds the cluster-wide defaults (DYNAMIC_DEFAULT_BROKER_CONFIG). Both
are kept in the metadata store (``broker-config/<id>``, ``broker-config/``) and layered over
the properties file: this broker's over the cluster's over the static ones. In a cluster every
broker follows the store: a cluster-wide default set through one broker is in effect on all.

What can change this way is what automq-py applies at once: the broker defaults of topic
configs (Kafka's ``DynamicLogConfig.ReconfigurableConfigs``: ``log.retention.ms``,
``log.segment.bytes``, ``message.max.bytes``, ``log.cleanup.policy``, ...), which the open
partitions take at once, as a topic config change does; and of the log cleaner's (Kafka's
``LogCleaner.ReconfigurableConfigs``) the one automq-py has, ``log.cleaner.backoff.ms``, how
often key compaction is checked, taken from the next check on; and ``producer.id.expiration.ms``,
which the partition leaders' next check for idle producers takes. ``advertised.listeners`` is
dynamic per broker, as in Kafka 3.9 (never a cluster-wide default), and held to what a KRaft
broker of 3.9 allows: its listener names must be the broker's listeners and no address may be
a wildcard, and the endpoints it names must be the ones the broker registered (Kafka: "Advertised
listeners cannot be altered when using a Raft-based metadata quorum"), so a value is accepted
(and then described as this broker's dynamic config) but clients are never sent elsewhere.
The replication throttles (``leader.replication.throttled.rate`` and its kin, which
``kafka-reassign-partitions.sh --throttle`` sets) are taken and described as Kafka takes them,
with nothing to throttle: a partition has one replica over shared storage.
Every other broker property is read-only, and changing it is refused as Kafka refuses a static
config.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import MappingProxyType

from automq_py.config import (
    TOPIC_CONFIG_SYNONYMS,
    BrokerConfig,
    check_topic_defaults,
    parse_listeners,
)
from automq_py.topic_config import ConfigLayers
from storage.config_def import ConfigError, parse_declared
from storage.metadata.manager import MetadataManager

KV_PREFIX = "broker-config/"

# The first broker synonym of each topic config, but the deprecated message format version
# (Kafka excludes it too): the properties that change without a restart.
RECONFIGURABLE = frozenset(synonyms[0].name for synonyms in TOPIC_CONFIG_SYNONYMS.values()) - {
    "log.message.format.version"
}
ADVERTISED_LISTENERS = "advertised.listeners"
# dynamic for one broker only (Kafka's DynamicBrokerConfig.PerBrokerConfigs)
PER_BROKER = frozenset({ADVERTISED_LISTENERS})
CLEANER_BACKOFF_MS = "log.cleaner.backoff.ms"
# the log cleaner's properties that change without a restart
CLEANER = frozenset({CLEANER_BACKOFF_MS})
# Kafka's replication throttles (DynamicConfig.Broker), which kafka-reassign-partitions.sh
# sets: taken, without effect (no replica traffic over shared storage)
THROTTLES = frozenset(
    {
        "leader.replication.throttled.rate",
        "follower.replication.throttled.rate",
        "replica.alter.log.dirs.io.max.bytes.per.second",
    }
)
PRODUCER_ID_EXPIRATION_MS = "producer.id.expiration.ms"
# the other broker properties that change without a restart, as in Kafka
OTHERS = frozenset({PRODUCER_ID_EXPIRATION_MS})
# what DescribeConfigs describes as not read-only
DYNAMIC = RECONFIGURABLE | PER_BROKER | CLEANER | THROTTLES | OTHERS


class RefusedConfigError(ConfigError):
    """A dynamic change Kafka refuses with INVALID_REQUEST (rather than INVALID_CONFIG)."""


class ReadOnlyConfigError(RefusedConfigError):
    """A broker property that cannot change while the broker runs."""


class DynamicBrokerConfig:
    """This broker's and the cluster's dynamic configs, over the static configuration."""

    def __init__(self, config: BrokerConfig, metadata: MetadataManager) -> None:
        self.config = config
        self.metadata = metadata
        self.node = str(config.node_id)
        self._listeners: list[Callable[[], None]] = []
        self._reload()
        metadata.add_kv_listener(KV_PREFIX, self._changed)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after the stored dynamic configs changed, here or through
        another broker of the cluster."""
        self._listeners.append(listener)

    def _reload(self) -> None:
        kv = self.metadata.image.kv
        self._own = _decode(kv.get(KV_PREFIX + self.node))
        self._default = _decode(kv.get(KV_PREFIX))

    def _changed(self) -> None:
        before = (self._own, self._default)
        self._reload()
        if (self._own, self._default) != before:
            for listener in self._listeners:
                listener()

    def layers(self) -> ConfigLayers:
        base = ConfigLayers.of(self.config)
        return ConfigLayers(
            MappingProxyType(dict(self._own)),
            MappingProxyType(dict(self._default)),
            base.static,
            base.defaults,
        )

    def current(self, resource: str) -> dict[str, str]:
        """The dynamic configs of broker resource ``resource`` (an id or the empty name)."""
        return dict(self._default if resource == "" else self._own)

    def topic_defaults(self) -> dict[str, str]:
        """The topic config defaults in effect, dynamic configs included."""
        return check_topic_defaults(self.layers().merged())

    def cleaner_backoff_ms(self) -> int:
        """``log.cleaner.backoff.ms`` in effect, dynamic configs included."""
        return self._int_in_effect(CLEANER_BACKOFF_MS, "log_cleaner_backoff_ms")

    def producer_id_expiration_ms(self) -> int:
        """``producer.id.expiration.ms`` in effect, dynamic configs included."""
        return self._int_in_effect(PRODUCER_ID_EXPIRATION_MS, "producer_id_expiration_ms")

    def _int_in_effect(self, name: str, field: str) -> int:
        """Broker property ``name`` (:class:`BrokerConfig` field ``field``) in effect: its
        dynamic value, else the static one (a stored value no longer valid is skipped, as
        Kafka skips one)."""
        value = self.layers().merged().get(name)
        if value is not None:
            try:
                parsed: int = parse_declared(BrokerConfig, {name: value})[field]
                return parsed
            except ConfigError:
                pass
        static: int = getattr(self.config, field)
        return static

    def validate(self, resource: str, configs: Mapping[str, str]) -> dict[str, str]:
        """The topic defaults that setting broker resource ``resource``'s dynamic configs to
        ``configs`` (the whole set) would give. Raises ReadOnlyConfigError for a property
        that cannot change dynamically, ConfigError for a bad value."""
        read_only = sorted(name for name in configs if name not in DYNAMIC)
        if read_only:
            raise ReadOnlyConfigError(
                f"Cannot update these configs dynamically: Set({', '.join(read_only)}) (automq-py "
                "changes only the broker defaults of topic configs, log.cleaner.backoff.ms, "
                "producer.id.expiration.ms, advertised.listeners and the replication "
                "throttles at run time; set the others in server.properties or --override)"
            )
        per_broker = sorted(name for name in configs if name in PER_BROKER)
        if resource == "" and per_broker:
            raise RefusedConfigError(
                "Cannot update these configs at default cluster level, broker id must be "
                f"specified: Set({', '.join(per_broker)})"
            )
        if ADVERTISED_LISTENERS in configs:
            check_advertised_listeners(self.config, configs[ADVERTISED_LISTENERS])
        parse_declared(
            BrokerConfig,
            {n: v for n, v in configs.items() if n in CLEANER or n in THROTTLES or n in OTHERS},
        )
        if resource == "":
            merged = {**self.config.properties, **configs, **self._own}
        else:
            merged = {**self.config.properties, **self._default, **configs}
        return check_topic_defaults(merged)

    async def alter(self, resource: str, configs: Mapping[str, str]) -> dict[str, str]:
        """Validate (:meth:`validate`) and store ``configs`` as broker resource ``resource``'s
        dynamic configs; return the topic defaults now in effect."""
        defaults = self.validate(resource, configs)
        stored = dict(sorted(configs.items()))
        key = KV_PREFIX + ("" if resource == "" else self.node)
        if stored:
            await self.metadata.put_kv(key, json.dumps(stored).encode())
        elif key in self.metadata.image.kv:
            await self.metadata.delete_kv(key)
        if resource == "":
            self._default = stored
        else:
            self._own = stored
        return defaults


def check_advertised_listeners(config: BrokerConfig, value: str) -> None:
    """Refuse (RefusedConfigError, with Kafka 3.9's messages) ``advertised.listeners`` set to
    ``value`` on a broker running with ``config``: it must parse, name the inter-broker
    listener and only the broker's listeners, no wildcard address, and (a KRaft broker's rule)
    the endpoints registered now."""
    try:
        advertised = parse_listeners(ADVERTISED_LISTENERS, value)
    except ConfigError as e:
        raise RefusedConfigError(f"Error creating broker listeners from '{value}': {e}") from None
    names = list(dict.fromkeys(x.name for x in advertised))
    known = [x.name for x in config.listeners]
    if config.security.inter_broker_listener(known) not in names:
        raise RefusedConfigError(
            "requirement failed: inter.broker.listener.name must be a listener name defined in "
            "advertised.listeners. The valid options based on currently configured listeners "
            f"are {','.join(names)}"
        )
    if not set(names) <= set(known):
        raise RefusedConfigError(
            "requirement failed: advertised.listeners listener names must be equal to or a "
            f"subset of the ones defined in listeners. Found {','.join(names)}. The valid "
            f"options based on the current configuration are {','.join(known)}"
        )
    if any(x.host == "0.0.0.0" for x in advertised):
        raise RefusedConfigError(
            "requirement failed: advertised.listeners cannot use the nonroutable meta-address "
            "0.0.0.0. Use a routable IP address."
        )
    if set(advertised) != set(config.advertised_listeners):
        # Kafka wraps the reconfiguration's ConfigException in ConfigException(name, value)
        raise RefusedConfigError(
            "Invalid value org.apache.kafka.common.config.ConfigException: Advertised listeners "
            "cannot be altered when using a Raft-based metadata quorum. for configuration "
            "Invalid dynamic configuration"
        )


def _decode(raw: bytes | None) -> dict[str, str]:
    if raw is None:
        return {}
    value = json.loads(raw)
    return {str(k): str(v) for k, v in value.items()}
