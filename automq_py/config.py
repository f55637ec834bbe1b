"""BrokerConfig: the broker's settings, read once from Kafka/AutoMQ property names.

:meth:`BrokerConfig.load` layers its sources, later wins:

1. a ``server.properties`` file (Java properties syntax, see :func:`parse_properties`);
2. with ``from_env`` (``serve --env``, the container image), ``KAFKA_*`` environment variables
   as Kafka's images map them (see :func:`env_properties`);
3. ``--override KEY=VALUE`` entries, in order;
4. AutoMQ's ``--s3-url`` (from ``automq-kafka-admin.sh generate-s3-url``), which sets
   ``s3.data.buckets`` and ``cluster.id`` (see :func:`s3_url_properties`).

The sources' parsers are in :mod:`automq_py.config_sources`.

The result is one frozen object passed down to every module: broker settings as attributes,
the stream store's as :attr:`BrokerConfig.storage` (:class:`storage.config.S3StreamConfig`),
and the broker-level ``log.*`` defaults translated for topics by :meth:`topic_defaults`.
Every error is a :class:`ConfigError` naming the property and the bad value.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from automq_py.config_sources import (
    HIDDEN,
    env_properties,
    parse_override,
    parse_properties,
    redact_url,
    s3_url_properties,
    with_env_credentials,
)
from automq_py.log.log_config import LogConfig
from automq_py.logs import FORMATS, LEVELS, LOGGER_LEVEL_PREFIX, logger_levels
from automq_py.security.config import LISTENER_PREFIX, SecurityConfig
from storage.config import S3StreamConfig
from storage.config_def import (
    INT_MAX,
    LONG_MAX,
    ConfigError,
    ConfigKey,
    ConfigType,
    config_field,
    declared_keys,
    format_value,
    parse_declared,
)

__all__ = [
    "TOPIC_CONFIG_SYNONYMS",
    "BrokerConfig",
    "ConfigError",
    "Listener",
    "default_properties",
    "env_properties",
    "parse_listeners",
    "parse_override",
    "parse_properties",
    "s3_url_properties",
]

log = logging.getLogger("automq.config")

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS

DEFAULT_LISTENERS = "PLAINTEXT://127.0.0.1:9092"
DEFAULT_DATA_DIR = "./data"
# Kafka's default listener.security.protocol.map: each protocol maps to itself.
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Addresses a server binds to but a client cannot connect to.
_WILDCARD_HOSTS = ("0.0.0.0", "::")
_SECRET_NAME = re.compile(r"password|secret|jaas\.config|ssl\.keystore\.key$", re.IGNORECASE)

# ``serve --env``: the variable holding AutoMQ's --s3-url
S3_URL_ENV = "AUTOMQ_S3_URL"


@dataclass(slots=True, frozen=True)
class Listener:
    """One ``NAME://host:port`` entry of ``listeners`` or ``advertised.listeners``."""

    name: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def _prop(name: str, default: Any, type: ConfigType, minimum: int | None, doc: str) -> Any:
    return config_field(name, default, type, doc, minimum=minimum)


def _buffer_size(value: int) -> str | None:
    """A socket buffer property's rule: bytes, or -1 for the OS's default."""
    return None if value == -1 or value > 0 else "must be -1 (the OS default) or above 0"


MIGRATION_POLICIES = ("disabled", "downgrade", "upgrade", "bidirectional")


def _migration_policy(value: str) -> str | None:
    """group.consumer.migration.policy's rule: one of Kafka's values, in any case."""
    if value.lower() in MIGRATION_POLICIES:
        return None
    return f"must be one of (case insensitive): {', '.join(p.upper() for p in MIGRATION_POLICIES)}"


def _composite(
    name: str, default: Any, type: ConfigType, doc: str, minimum: int | None = None
) -> ConfigKey:
    return ConfigKey(name, type, default, doc, minimum=minimum)


# Properties read by hand in BrokerConfig.from_properties (several names feed one attribute, or
# the value is structured); a default of None: another property decides.
_COMPOSITE_KEYS = {
    key.name: key
    for key in (
        _composite(
            "listeners", DEFAULT_LISTENERS, ConfigType.STRING, "NAME://HOST:PORT,... to bind"
        ),
        _composite(
            "advertised.listeners",
            None,
            ConfigType.STRING,
            "NAME://HOST:PORT,... clients connect to (default: listeners)",
        ),
        _composite(
            "listener.security.protocol.map",
            ",".join(f"{p}:{p}" for p in SECURITY_PROTOCOLS),
            ConfigType.STRING,
            "NAME:PROTOCOL,... (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)",
        ),
        _composite("controller.listener.names", "", ConfigType.STRING, "listeners not advertised"),
        _composite("log.dirs", None, ConfigType.STRING, "the data directory: WAL and metadata"),
        _composite("log.dir", DEFAULT_DATA_DIR, ConfigType.STRING, "log.dirs, if that is unset"),
    )
}


@dataclass(slots=True, frozen=True)
class Synonym:
    """A broker property that sets a topic config's default; ``unit_ms``: one of its units in
    milliseconds (``log.retention.hours``), 1 when it is in the topic config's own unit."""

    name: str
    unit_ms: int = 1


# Topic config -> the broker properties its default is read from, highest precedence first
# (Kafka's ServerTopicConfigSynonyms): the first one set wins, else the first with a default.
TOPIC_CONFIG_SYNONYMS: dict[str, tuple[Synonym, ...]] = {
    "segment.bytes": (Synonym("log.segment.bytes"),),
    "segment.ms": (Synonym("log.roll.ms"), Synonym("log.roll.hours", HOUR_MS)),
    "segment.jitter.ms": (Synonym("log.roll.jitter.ms"), Synonym("log.roll.jitter.hours", HOUR_MS)),
    "segment.index.bytes": (Synonym("log.index.size.max.bytes"),),
    "flush.messages": (Synonym("log.flush.interval.messages"),),
    "flush.ms": (Synonym("log.flush.interval.ms"), Synonym("log.flush.scheduler.interval.ms")),
    "retention.bytes": (Synonym("log.retention.bytes"),),
    "retention.ms": (
        Synonym("log.retention.ms"),
        Synonym("log.retention.minutes", MINUTE_MS),
        Synonym("log.retention.hours", HOUR_MS),
    ),
    "max.message.bytes": (Synonym("message.max.bytes"),),
    "index.interval.bytes": (Synonym("log.index.interval.bytes"),),
    "delete.retention.ms": (Synonym("log.cleaner.delete.retention.ms"),),
    "min.compaction.lag.ms": (Synonym("log.cleaner.min.compaction.lag.ms"),),
    "max.compaction.lag.ms": (Synonym("log.cleaner.max.compaction.lag.ms"),),
    "file.delete.delay.ms": (Synonym("log.segment.delete.delay.ms"),),
    "min.cleanable.dirty.ratio": (Synonym("log.cleaner.min.cleanable.ratio"),),
    "cleanup.policy": (Synonym("log.cleanup.policy"),),
    "unclean.leader.election.enable": (Synonym("unclean.leader.election.enable"),),
    "min.insync.replicas": (Synonym("min.insync.replicas"),),
    "compression.type": (Synonym("compression.type"),),
    "compression.gzip.level": (Synonym("compression.gzip.level"),),
    "compression.lz4.level": (Synonym("compression.lz4.level"),),
    "compression.zstd.level": (Synonym("compression.zstd.level"),),
    "preallocate": (Synonym("log.preallocate"),),
    "message.format.version": (Synonym("log.message.format.version"),),
    "message.timestamp.type": (Synonym("log.message.timestamp.type"),),
    "message.timestamp.difference.max.ms": (Synonym("log.message.timestamp.difference.max.ms"),),
    "message.timestamp.before.max.ms": (Synonym("log.message.timestamp.before.max.ms"),),
    "message.timestamp.after.max.ms": (Synonym("log.message.timestamp.after.max.ms"),),
    "message.downconversion.enable": (Synonym("log.message.downconversion.enable"),),
    "local.retention.ms": (Synonym("log.local.retention.ms"),),
    "local.retention.bytes": (Synonym("log.local.retention.bytes"),),
}

# Kafka's broker defaults where they are not the topic config's: None leaves the property
# unset, so a later synonym decides.
_BROKER_DEFAULTS: dict[str, Any] = {
    "log.roll.ms": None,
    "log.roll.hours": 168,
    "log.roll.jitter.ms": None,
    "log.roll.jitter.hours": 0,
    "log.retention.ms": None,
    "log.retention.minutes": None,
    "log.retention.hours": 168,
    "log.flush.interval.ms": None,
}


@functools.cache
def synonym_keys() -> Mapping[str, ConfigKey]:
    """The broker property behind each topic config default, as a key derived from the topic
    config's (same type and bounds; hours and minutes are INTs)."""
    topic_keys = LogConfig.properties()
    keys: dict[str, ConfigKey] = {}
    for topic_name, synonyms in TOPIC_CONFIG_SYNONYMS.items():
        _, topic_key = topic_keys[topic_name]
        for synonym in synonyms:
            default = _BROKER_DEFAULTS.get(synonym.name, topic_key.default)
            # retention: any negative value keeps data forever
            minimum = None if topic_name == "retention.ms" else topic_key.minimum
            doc = f"default of topic config {topic_name}: {topic_key.doc}"
            if synonym.unit_ms != 1:
                unit = "hours" if synonym.unit_ms == HOUR_MS else "minutes"
                doc = f"{topic_name} in {unit}"
                key = ConfigKey(synonym.name, ConfigType.INT, default, doc, minimum=minimum)
            else:
                key = dataclasses.replace(
                    topic_key, name=synonym.name, default=default, doc=doc, minimum=minimum
                )
            keys[synonym.name] = key
    return MappingProxyType(keys)


def topic_defaults_of(props: Mapping[str, str]) -> dict[str, str]:
    """The topic config defaults that broker properties ``props`` give (Kafka's
    ``KafkaConfig.extractLogConfigMap``), by topic config name. Raises ConfigError naming the
    broker property."""
    keys = synonym_keys()
    out: dict[str, str] = {}
    for topic_name, synonyms in TOPIC_CONFIG_SYNONYMS.items():
        given = [s for s in synonyms if s.name in props]
        if given:
            synonym = given[0]
            value = keys[synonym.name].parse(props[synonym.name])
        else:
            with_default = [s for s in synonyms if keys[s.name].default is not None]
            synonym = with_default[0]
            value = keys[synonym.name].default
        if synonym.unit_ms != 1:
            value *= synonym.unit_ms
        if topic_name == "retention.ms" and value < 0:
            value = -1
        out[topic_name] = format_value(value)
    return out


@dataclass(slots=True, frozen=True)
class BrokerConfig:
    """Everything the broker is configured with; build it with :meth:`load`."""

    node_id: int = _prop("node.id", 0, ConfigType.INT, 0, "this broker's node id")
    cluster_id: str = _prop(
        "cluster.id",
        "automq-py",
        ConfigType.STRING,
        None,
        "cluster id; objects live under _kafka_<id>",
    )
    broker_rack: str = _prop(
        "broker.rack",
        "",
        ConfigType.STRING,
        None,
        "this broker's rack (or zone): partition leaders are spread over racks",
    )
    broker_heartbeat_interval_ms: int = _prop(
        "broker.heartbeat.interval.ms",
        2000,
        ConfigType.INT,
        1,
        "how often a broker of a cluster tells the controller it is alive",
    )
    broker_session_timeout_ms: int = _prop(
        "broker.session.timeout.ms",
        9000,
        ConfigType.INT,
        1,
        "a broker silent this long is fenced and its partitions are led by others",
    )
    auto_leader_rebalance_enable: bool = _prop(
        "auto.leader.rebalance.enable",
        True,
        ConfigType.BOOLEAN,
        None,
        "the controller evens out partition leadership when a broker joins the cluster",
    )
    listeners: tuple[Listener, ...] = (Listener("PLAINTEXT", "127.0.0.1", 9092),)
    advertised_listeners: tuple[Listener, ...] = (Listener("PLAINTEXT", "127.0.0.1", 9092),)
    data_dir: str = DEFAULT_DATA_DIR
    auto_create_topics_enable: bool = _prop(
        "auto.create.topics.enable",
        True,
        ConfigType.BOOLEAN,
        None,
        "create unknown topics on metadata/produce",
    )
    num_partitions: int = _prop(
        "num.partitions", 1, ConfigType.INT, 1, "partitions of an auto-created topic"
    )
    default_replication_factor: int = _prop(
        "default.replication.factor",
        1,
        ConfigType.INT,
        None,
        "accepted for compatibility; object storage makes replication unnecessary",
    )
    metrics_port: int = config_field(
        "metrics.port",
        -1,
        ConfigType.INT,
        "HTTP port of /metrics (Prometheus), /healthz and /readyz; -1: off, 0: any free port",
        minimum=-1,
        maximum=65535,
    )
    metrics_host: str = _prop(
        "metrics.host",
        "",
        ConfigType.STRING,
        None,
        "address the metrics port binds to (empty: the first listener's host)",
    )
    metrics_partition_series_enable: bool = _prop(
        "metrics.partition.series.enable",
        True,
        ConfigType.BOOLEAN,
        None,
        "per-partition series (log offsets and size, consumer lag per partition); off for "
        "many partitions: per-topic and per-group series remain",
    )
    fetch_max_bytes: int = _prop(
        "fetch.max.bytes",
        57671680,
        ConfigType.INT,
        1024,
        "the most bytes a fetch returns (a request's max_bytes above it is cut to it), beyond "
        "the first batch of the first partition with data, which is always whole",
    )
    socket_request_max_bytes: int = _prop(
        "socket.request.max.bytes", 104857600, ConfigType.INT, 1, "largest request the server reads"
    )
    # Kafka's socket buffer sizes, -1 for the OS's own, which Linux grows with the connection.
    # The send buffer takes Kafka's default: a fetch response of several MB then goes out in
    # pieces as the consumer takes them in, not queued whole at once. Saturated consumes on
    # loopback, alternated against the OS's buffer (raised to 4 MiB for such responses): 1 KiB
    # records 1,473-1,596 against 1,290-1,367 MB/s, 16 KiB 2,172-2,509 against 1,699-1,928, the
    # broker's CPU per read a sixth lower (bench/README.md, "Saturated"). The receive buffer
    # stays the OS's: at a 100 KiB receive buffer a Produce request of ~750 KB arrives a window
    # at a time, each waiting for the event loop's read, and saturated 1 KiB produce fell from
    # 547-654 to 385-576 MB/s, its CPU from 1.4-1.7 to 1.8-2.3 s/GB.
    socket_send_buffer_bytes: int = config_field(
        "socket.send.buffer.bytes",
        102400,
        ConfigType.INT,
        "SO_SNDBUF of the server's connections, bytes (-1: the OS default, which grows the "
        "buffer with the connection, raised once to 4 MiB, within net.core.wmem_max, when a "
        "response does not fit); a consumer far away (a long round trip) reads faster with "
        "more",
        check=_buffer_size,
    )
    socket_receive_buffer_bytes: int = config_field(
        "socket.receive.buffer.bytes",
        -1,
        ConfigType.INT,
        "SO_RCVBUF of the server's sockets, bytes (-1: the OS default, which grows the buffer "
        "with the connection; Kafka's default is 102400)",
        check=_buffer_size,
    )
    event_loop_pin_cpu: bool = _prop(
        "event.loop.pin.cpu",
        True,
        ConfigType.BOOLEAN,
        None,
        "keep the event loop's thread on the CPU it runs on, moved when another thread crowds "
        "that CPU: on a machine shared with clients, their threads are then not woken behind "
        "it (false: wherever the OS places it)",
    )
    connections_max_idle_ms: int = _prop(
        "connections.max.idle.ms",
        600_000,
        ConfigType.LONG,
        None,
        "close connections idle this long",
    )
    group_initial_rebalance_delay_ms: int = _prop(
        "group.initial.rebalance.delay.ms",
        3000,
        ConfigType.INT,
        0,
        "wait for members of a new group",
    )
    offsets_topic_num_partitions: int = _prop(
        "offsets.topic.num.partitions", 50, ConfigType.INT, 1, "partitions of __consumer_offsets"
    )
    log_cleaner_backoff_ms: int = _prop(
        "log.cleaner.backoff.ms",
        15_000,
        ConfigType.LONG,
        0,
        "how often compacted topics are checked for key compaction",
    )
    transaction_state_log_num_partitions: int = _prop(
        "transaction.state.log.num.partitions",
        50,
        ConfigType.INT,
        1,
        "partitions of __transaction_state",
    )
    transaction_max_timeout_ms: int = _prop(
        "transaction.max.timeout.ms",
        900_000,
        ConfigType.INT,
        1,
        "largest transaction.timeout.ms a producer may ask for",
    )
    producer_id_expiration_ms: int = _prop(
        "producer.id.expiration.ms",
        86_400_000,
        ConfigType.INT,
        1,
        "a partition leader forgets an idempotent producer that wrote nothing for this long "
        "(never one with a transaction open); dynamic",
    )
    producer_id_expiration_check_interval_ms: int = _prop(
        "producer.id.expiration.check.interval.ms",
        600_000,
        ConfigType.INT,
        1,
        "how often the partition leaders look for producer ids past producer.id.expiration.ms",
    )
    transactional_id_expiration_ms: int = _prop(
        "transactional.id.expiration.ms",
        604_800_000,
        ConfigType.INT,
        1,
        "a transactional id idle this long is forgotten",
    )
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = _prop(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        10_000,
        ConfigType.INT,
        1,
        "how often transactions past their timeout are aborted",
    )
    transaction_remove_expired_transaction_cleanup_interval_ms: int = _prop(
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        3_600_000,
        ConfigType.INT,
        1,
        "how often expired transactional ids are removed",
    )
    offsets_topic_segment_bytes: int = _prop(
        "offsets.topic.segment.bytes",
        100 * 1024 * 1024,
        ConfigType.INT,
        1,
        "segment.bytes of __consumer_offsets (small: compacted sooner)",
    )
    transaction_state_log_segment_bytes: int = _prop(
        "transaction.state.log.segment.bytes",
        100 * 1024 * 1024,
        ConfigType.INT,
        1,
        "segment.bytes of __transaction_state",
    )
    offsets_retention_minutes: int = _prop(
        "offsets.retention.minutes",
        10080,
        ConfigType.INT,
        1,
        "committed offsets of an empty group expire after this long",
    )
    offsets_retention_check_interval_ms: int = _prop(
        "offsets.retention.check.interval.ms",
        600_000,
        ConfigType.LONG,
        1,
        "how often offsets expire",
    )
    offset_metadata_max_bytes: int = _prop(
        "offset.metadata.max.bytes", 4096, ConfigType.INT, 0, "largest metadata string of a commit"
    )
    group_min_session_timeout_ms: int = _prop(
        "group.min.session.timeout.ms", 6000, ConfigType.INT, 0, "smallest session timeout accepted"
    )
    group_max_session_timeout_ms: int = _prop(
        "group.max.session.timeout.ms",
        1_800_000,
        ConfigType.INT,
        0,
        "largest session timeout accepted",
    )
    group_max_size: int = _prop(
        "group.max.size", INT_MAX, ConfigType.INT, 1, "members of a classic group at most"
    )
    group_consumer_session_timeout_ms: int = _prop(
        "group.consumer.session.timeout.ms",
        45_000,
        ConfigType.INT,
        1,
        "session timeout of consumer-protocol (KIP-848) members",
    )
    group_consumer_heartbeat_interval_ms: int = _prop(
        "group.consumer.heartbeat.interval.ms",
        5000,
        ConfigType.INT,
        1,
        "heartbeat interval of consumer-protocol (KIP-848) members",
    )
    # the range a group's own consumer.session.timeout.ms and consumer.heartbeat.interval.ms
    # (kafka-configs --entity-type groups) must fall in
    group_consumer_min_session_timeout_ms: int = _prop(
        "group.consumer.min.session.timeout.ms",
        45_000,
        ConfigType.INT,
        1,
        "smallest consumer.session.timeout.ms a consumer group may set",
    )
    group_consumer_max_session_timeout_ms: int = _prop(
        "group.consumer.max.session.timeout.ms",
        60_000,
        ConfigType.INT,
        1,
        "largest consumer.session.timeout.ms a consumer group may set",
    )
    group_consumer_min_heartbeat_interval_ms: int = _prop(
        "group.consumer.min.heartbeat.interval.ms",
        5000,
        ConfigType.INT,
        1,
        "smallest consumer.heartbeat.interval.ms a consumer group may set",
    )
    group_consumer_max_heartbeat_interval_ms: int = _prop(
        "group.consumer.max.heartbeat.interval.ms",
        15_000,
        ConfigType.INT,
        1,
        "largest consumer.heartbeat.interval.ms a consumer group may set",
    )
    group_consumer_max_size: int = _prop(
        "group.consumer.max.size",
        INT_MAX,
        ConfigType.INT,
        1,
        "members of a consumer group at most",
    )
    group_consumer_assignors: tuple[str, ...] = _prop(
        "group.consumer.assignors",
        ("uniform", "range"),
        ConfigType.LIST,
        None,
        "server-side assignors of consumer groups; the first is the default",
    )
    group_consumer_migration_policy: str = config_field(
        "group.consumer.migration.policy",
        "bidirectional",
        ConfigType.STRING,
        "moving a non-empty group between the classic and the consumer protocol as its "
        "members switch group.protocol: bidirectional, upgrade (classic to consumer), "
        "downgrade, or disabled (empty groups convert either way)",
        check=_migration_policy,
    )
    delete_topic_enable: bool = _prop(
        "delete.topic.enable", True, ConfigType.BOOLEAN, None, "allow DeleteTopics"
    )
    # Kafka's replication throttles (set by kafka-reassign-partitions.sh --throttle): taken and
    # described as Kafka takes them; a partition has one replica over shared storage here, so
    # no replica traffic is there to throttle
    leader_replication_throttled_rate: int = _prop(
        "leader.replication.throttled.rate",
        LONG_MAX,
        ConfigType.LONG,
        0,
        "bytes/s of replication a leader may send (no replica traffic: no effect)",
    )
    follower_replication_throttled_rate: int = _prop(
        "follower.replication.throttled.rate",
        LONG_MAX,
        ConfigType.LONG,
        0,
        "bytes/s of replication a follower may fetch (no replica traffic: no effect)",
    )
    replica_alter_log_dirs_io_max_bytes_per_second: int = _prop(
        "replica.alter.log.dirs.io.max.bytes.per.second",
        LONG_MAX,
        ConfigType.LONG,
        0,
        "bytes/s of moving logs between directories (one log directory: no effect)",
    )
    log_retention_check_interval_ms: int = _prop(
        "log.retention.check.interval.ms",
        300_000,
        ConfigType.LONG,
        1,
        "how often retention runs (then GC of objects)",
    )
    log_format: str = config_field(
        "log.format",
        "text",
        ConfigType.STRING,
        "the broker's log lines: text, or json (one object per line, for a log pipeline)",
        choices=FORMATS,
    )
    log_level: str = config_field(
        "log.level",
        "INFO",
        ConfigType.STRING,
        "the root logger's level (log.level.<logger>=LEVEL sets one logger's)",
        choices=LEVELS,
    )
    # log.level.<logger> properties: logger -> level
    logger_levels: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    storage: S3StreamConfig = field(default_factory=S3StreamConfig)
    # listeners' TLS and SASL, the authorizer
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # the topic config defaults the properties give, by topic config name (topic_defaults)
    log_defaults: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType(topic_defaults_of({})), hash=False, repr=False
    )
    # Every property as given (after layering), known or not, for features that read more later.
    properties: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, repr=False
    )

    @classmethod
    def load(
        cls,
        path: str | None = None,
        overrides: Sequence[str] = (),
        s3_url: str | None = None,
        env: Mapping[str, str] | None = None,
        from_env: bool = False,
    ) -> BrokerConfig:
        """Read ``path`` (if given), then with ``from_env`` the ``KAFKA_*`` variables of
        ``env``, apply ``overrides`` (``KEY=VALUE``, later wins), then ``s3_url`` (or
        ``AUTOMQ_S3_URL`` from ``env`` with ``from_env``); see the module docstring.

        Otherwise ``env`` is consulted only for AutoMQ's ``KAFKA_S3_ACCESS_KEY`` /
        ``KAFKA_S3_SECRET_KEY``; ``None`` means no environment (the CLI passes ``os.environ``).
        Raises ConfigError.
        """
        props: dict[str, str] = {}
        if path is not None:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except FileNotFoundError:
                raise ConfigError(f"{path}: no such properties file") from None
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError(f"{path}: cannot read the properties file: {e}") from None
            props.update(parse_properties(text))
        if from_env and env is not None:
            props.update(env_properties(env))
            if s3_url is None:
                s3_url = env.get(S3_URL_ENV) or None
        for text in overrides:
            key, value = parse_override(text)
            props[key] = value
        if s3_url is not None:
            props.update(s3_url_properties(s3_url))
        return cls.from_properties(props, env=env)

    @classmethod
    def from_properties(
        cls, props: Mapping[str, str], *, env: Mapping[str, str] | None = None
    ) -> BrokerConfig:
        """Build from ``name -> string value``; unknown names are kept and logged once each."""
        known = cls.config_keys()
        for name in props:
            if name not in known and not name.startswith((LISTENER_PREFIX, LOGGER_LEVEL_PREFIX)):
                log.warning("property %r is not used by automq-py; ignored", name)

        values = parse_declared(cls, props)
        try:
            levels = logger_levels(props)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        listeners, advertised, protocols = _listeners(props)
        data_dir = _data_dir(props)
        node_id = values.get("node_id", 0)
        cluster_id = values.get("cluster_id", "automq-py")
        config = cls(
            listeners=listeners,
            advertised_listeners=advertised,
            data_dir=data_dir,
            storage=_storage(props, data_dir, node_id, cluster_id, env or {}),
            security=SecurityConfig.from_properties(props, protocols),
            properties=MappingProxyType(dict(props)),
            log_defaults=MappingProxyType(check_topic_defaults(props)),
            logger_levels=MappingProxyType(levels),
            **values,
        )
        if config.broker_session_timeout_ms <= config.broker_heartbeat_interval_ms:
            raise ConfigError(
                f"broker.session.timeout.ms ({config.broker_session_timeout_ms}) must be larger "
                f"than broker.heartbeat.interval.ms ({config.broker_heartbeat_interval_ms})"
            )
        return config

    @property
    def cluster_mode(self) -> bool:
        """Whether this broker is one of several sharing its metadata (PostgreSQL)."""
        return self.storage.metadata_url.startswith(("postgresql://", "postgres://"))

    @classmethod
    def config_keys(cls) -> dict[str, ConfigKey]:
        """Every property automq-py reads (the broker's and the stream store's), by name."""
        keys = {name: key for name, (_, key) in declared_keys(cls).items()}
        keys.update(_COMPOSITE_KEYS)
        keys.update(SecurityConfig.keys())
        keys.update(synonym_keys())
        keys.update((name, key) for name, (_, key) in S3StreamConfig.properties().items())
        return keys

    def topic_defaults(self) -> dict[str, str]:
        """The topic config defaults the broker's properties give (:func:`topic_defaults_of`),
        which a topic's own configs override: see
        :func:`automq_py.topic_config.effective_topic_config`."""
        return dict(self.log_defaults)

    def all_properties(self, *, redact: bool = True) -> dict[str, str]:
        """Every property's effective value (given ones, unknown ones, defaults), by name.

        With ``redact`` (the default) secrets read ``[hidden]``, as Kafka shows passwords: the
        ``secretKey`` of ``s3.data.buckets`` and properties named like a password or secret.
        """
        out = {
            n: format_value(k.default) for n, k in _COMPOSITE_KEYS.items() if k.default is not None
        }
        for name, key in SecurityConfig.keys().items():
            if key.default is not None:
                out[name] = format_value(key.default)
        out.update(self.properties)
        for name, (attr, _) in declared_keys(BrokerConfig).items():
            out[name] = format_value(getattr(self, attr))
        out["listeners"] = ",".join(str(listener) for listener in self.listeners)
        out["advertised.listeners"] = ",".join(str(x) for x in self.advertised_listeners)
        out["log.dirs"] = self.data_dir
        out.pop("log.dir", None)
        for name, key in synonym_keys().items():
            if name not in out and key.default is not None:
                out[name] = format_value(key.default)
        for name, (attr, _) in S3StreamConfig.properties().items():
            out[name] = format_value(getattr(self.storage, attr))
        if redact:
            out = {name: _redacted(name, value) for name, value in out.items()}
        return dict(sorted(out.items()))


def check_topic_defaults(props: Mapping[str, str]) -> dict[str, str]:
    """:func:`topic_defaults_of` ``props``, held to LogConfig's rules: a broker default it
    rejects would fail every topic later, so it fails now and names the broker property (as
    the user wrote it: ``log.retention.hours``, say)."""
    defaults = topic_defaults_of(props)
    try:
        LogConfig.from_properties(defaults)
    except ConfigError as e:
        message = str(e)
        for topic_name, synonyms in TOPIC_CONFIG_SYNONYMS.items():
            if message.startswith(f"{topic_name}:"):
                given = [s.name for s in synonyms if s.name in props]
                broker_name = given[0] if given else synonyms[0].name
                message = broker_name + message[len(topic_name) :]
                break
        raise ConfigError(message) from None
    return defaults


@functools.cache
def default_properties() -> Mapping[str, str]:
    """Every property's value when nothing is configured (DescribeConfigs' DEFAULT_CONFIG)."""
    return MappingProxyType(BrokerConfig.from_properties({}).all_properties())


# --- composite properties ------------------------------------------------------------------


def _data_dir(props: Mapping[str, str]) -> str:
    """``log.dirs`` (else ``log.dir``): one directory, holding the WAL and the metadata."""
    name = "log.dirs" if "log.dirs" in props else "log.dir"
    raw = props.get(name, DEFAULT_DATA_DIR)
    dirs = [d.strip() for d in raw.split(",") if d.strip()]
    if len(dirs) != 1:
        raise ConfigError(f"{name}: expected one directory (data lives in S3), got {raw!r}")
    return dirs[0]


def parse_listeners(name: str, text: str) -> tuple[Listener, ...]:
    """Parse a ``NAME://host:port,...`` list; an empty host means every interface (0.0.0.0).

    ``name`` is the property being parsed, for the error messages.
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"{name}: expected NAME://HOST:PORT[,...], got {text!r}")
    listeners: list[Listener] = []
    for item in items:
        listener_name, sep, address = item.partition("://")
        host, colon, port_text = address.rpartition(":")
        if not sep or not listener_name or not colon:
            raise ConfigError(f"{name}: expected NAME://HOST:PORT, got {item!r}")
        if host.startswith("[") and host.endswith("]"):  # IPv6 literal
            host = host[1:-1]
        if not (port_text.isascii() and port_text.isdigit()):
            raise ConfigError(f"{name}: bad port {port_text!r} in {item!r}")
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ConfigError(f"{name}: port must be in 0..65535, got {port} in {item!r}")
        # Kafka compares listener names case-insensitively by upper-casing them.
        listeners.append(Listener(listener_name.upper(), host or "0.0.0.0", port))
    names = [listener.name for listener in listeners]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{name}: each listener needs its own name, {duplicates[0]} repeats")
    return tuple(listeners)


def _listeners(
    props: Mapping[str, str],
) -> tuple[tuple[Listener, ...], tuple[Listener, ...], dict[str, str]]:
    """The listeners, the advertised ones, and each listener's security protocol."""
    listeners = parse_listeners("listeners", props.get("listeners", DEFAULT_LISTENERS))
    bound = [(x.host, x.port) for x in listeners if x.port != 0]
    if len(bound) != len(set(bound)):
        raise ConfigError(f"listeners: two listeners on one address in {props['listeners']!r}")
    controller_names = {
        n.strip().upper() for n in props.get("controller.listener.names", "").split(",") if n
    }
    protocols = _security_protocols(listeners, props, controller_names)

    if "advertised.listeners" in props:
        source = "advertised.listeners"
        advertised = parse_listeners(source, props[source])
    else:
        # Kafka advertises the listeners except the controller's.
        source = "advertised.listeners (defaults to listeners)"
        advertised = tuple(x for x in listeners if x.name not in controller_names)
        if not advertised:
            raise ConfigError(
                "listeners: every listener is named in controller.listener.names; add a client one"
            )
    listener_names = {x.name for x in listeners}
    for x in advertised:
        if x.name not in listener_names:
            raise ConfigError(f"advertised.listeners: {x} names no listener in listeners")
        if x.host in _WILDCARD_HOSTS:
            raise ConfigError(
                f"{source}: {x} is not an address clients can reach; set advertised.listeners "
                f"to this host's name or IP"
            )
    return listeners, advertised, protocols


def _security_protocols(
    listeners: Iterable[Listener], props: Mapping[str, str], controller_names: set[str]
) -> dict[str, str]:
    name = "listener.security.protocol.map"
    raw = props.get(name, _COMPOSITE_KEYS[name].default)
    protocols: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        listener_name, sep, protocol = entry.partition(":")
        if not sep or not listener_name.strip() or not protocol.strip():
            raise ConfigError(f"{name}: expected NAME:PROTOCOL[,...], got {raw!r}")
        protocols[listener_name.strip().upper()] = protocol.strip().upper()
    out: dict[str, str] = {}
    for listener in listeners:
        # Kafka lets a controller listener left out of the map default to PLAINTEXT.
        mapped = protocols.get(
            listener.name, "PLAINTEXT" if listener.name in controller_names else None
        )
        if mapped is None:
            raise ConfigError(
                f"listeners: {listener} has no security protocol; map it in {name} "
                f"(e.g. {listener.name}:PLAINTEXT)"
            )
        if mapped not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"{name}: {listener.name}:{mapped} is no security protocol; use one of "
                f"{', '.join(SECURITY_PROTOCOLS)}"
            )
        out[listener.name] = mapped
    return out


def _storage(
    props: Mapping[str, str],
    data_dir: str,
    node_id: int,
    cluster_id: str,
    env: Mapping[str, str],
) -> S3StreamConfig:
    """S3StreamConfig from the same properties, its paths defaulting under the data directory
    so a broker with no s3.* settings runs embedded: WAL, metadata and objects on local disk."""
    known = S3StreamConfig.properties()
    storage_props = {name: value for name, value in props.items() if name in known}
    absolute = os.path.abspath(data_dir)
    storage_props.setdefault("s3.wal.path", os.path.join(data_dir, "wal"))
    storage_props.setdefault(
        "metadata.store.url", "sqlite://" + os.path.join(absolute, "metadata.db")
    )
    storage_props.setdefault("s3.data.buckets", Path(absolute, "objects").as_uri())
    storage_props["s3.data.buckets"] = with_env_credentials(storage_props["s3.data.buckets"], env)
    storage_props["node.id"] = str(node_id)
    storage_props["cluster.id"] = cluster_id
    config = S3StreamConfig.from_properties(storage_props)
    return dataclasses.replace(config, log_format=props.get("log.format", "text").strip())


def _redacted(name: str, value: str) -> str:
    if _SECRET_NAME.search(name):
        return HIDDEN
    if "://" in value:  # a store's URL (s3.data.buckets, s3.wal.path, metadata.store.url...)
        return redact_url(value)
    return value
