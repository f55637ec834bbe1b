"""BrokerConfig: properties files, layering, AutoMQ's --s3-url, derived defaults, errors, CLI."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.config import (
    BrokerConfig,
    ConfigError,
    Listener,
    env_properties,
    parse_properties,
    s3_url_properties,
)
from automq_py.log.log_config import LogConfig
from storage.metadata.store import sqlite_path
from storage.operator import LocalObjectStore, S3ObjectStore, open_object_store
from tests.storage.test_config_def import raw_text

REPO = Path(__file__).resolve().parents[2]
# The url automq-kafka-admin.sh generate-s3-url printed in seed 000 (MinIO on 192.168.31.129).
SEED_S3_URL = (
    "s3://192.168.31.129:9000?s3-access-key=minioadmin&s3-secret-key=minioadmin"
    "&s3-region=ignore-here&s3-endpoint-protocol=http&s3-data-bucket=automq&s3-path-style=true"
    "&s3-ops-bucket=automq&cluster-id=5kilSYquT962mUNQ8dL7qA"
)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "server.properties"
    path.write_text(text, encoding="utf-8")
    return str(path)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "automq_py", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
    )


# --- the properties file ---------------------------------------------------------------------


def test_properties_syntax_comments_separators_continuations_and_escapes() -> None:
    text = (
        "# a comment\n"
        "   ! another comment\n"
        "\n"
        "num.partitions=3\n"
        "log.dirs : /var/data  \n"
        "cluster.id   abc\n"
        "listeners=PLAINTEXT://127.0.0.1:9092,\\\n"
        "          OTHER://127.0.0.1:9093\n"
        "key\\=with\\:colon=value\\tafter tab \\u00e9\n"
        "# a comment ending in a backslash does not continue \\\n"
        "empty=\n"
        "num.partitions=4\n"
    )
    assert parse_properties(text) == {
        "num.partitions": "4",
        "log.dirs": "/var/data",
        "cluster.id": "abc",
        "listeners": "PLAINTEXT://127.0.0.1:9092,OTHER://127.0.0.1:9093",
        "key=with:colon": "value\tafter tab \u00e9",
        "empty": "",
    }


def test_an_even_number_of_trailing_backslashes_does_not_continue() -> None:
    assert parse_properties("a=x\\\\\nb=y\n") == {"a": "x\\", "b": "y"}


def test_file_values_reach_the_config(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "node.id: 3\n"
        "auto.create.topics.enable = FALSE\n"
        "num.partitions 6\n"
        "log.cleanup.policy=compact, delete\n"
        "log.message.timestamp.type=LogAppendTime\n",
    )
    config = BrokerConfig.load(path)
    assert config.node_id == 3
    assert config.storage.node_id == 3
    assert config.auto_create_topics_enable is False
    assert config.num_partitions == 6
    assert config.topic_defaults()["cleanup.policy"] == "compact,delete"
    assert config.topic_defaults()["message.timestamp.type"] == "LogAppendTime"


def test_a_missing_file_names_its_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.properties")
    with pytest.raises(ConfigError, match=r"nope\.properties"):
        BrokerConfig.load(missing)


def test_the_shipped_server_properties_is_the_built_in_default() -> None:
    shipped = BrokerConfig.load(str(REPO / "config" / "server.properties"))
    assert shipped.all_properties() == BrokerConfig.load().all_properties()


# --- layering: file, --override, --s3-url ------------------------------------------------------


def test_overrides_win_over_the_file_and_the_last_override_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "num.partitions=2\nmessage.max.bytes=2000\n")
    config = BrokerConfig.load(path, ["num.partitions=5", "num.partitions=7", "cluster.id=a-b_c"])
    assert config.num_partitions == 7
    assert config.topic_defaults()["max.message.bytes"] == "2000"
    assert config.cluster_id == "a-b_c"


def test_an_override_value_may_contain_equals_signs() -> None:
    url = "0@s3://b?region=r&pathStyle=true"
    config = BrokerConfig.load(overrides=[f"s3.data.buckets={url}"])
    assert config.storage.data_url == url


def test_a_malformed_override_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"--override expects KEY=VALUE, got 'num\.partitions'"):
        BrokerConfig.load(overrides=["num.partitions"])


def test_s3_url_maps_to_s3_data_buckets_and_cluster_id() -> None:
    props = s3_url_properties(SEED_S3_URL)
    assert props == {
        "s3.data.buckets": (
            "0@s3://automq?region=ignore-here&endpoint=http://192.168.31.129:9000"
            "&pathStyle=true&accessKey=minioadmin&secretKey=minioadmin"
        ),
        "cluster.id": "5kilSYquT962mUNQ8dL7qA",
    }


def test_s3_url_is_a_url_the_object_store_factory_opens() -> None:
    config = BrokerConfig.load(s3_url=SEED_S3_URL)
    assert config.cluster_id == config.storage.cluster_id == "5kilSYquT962mUNQ8dL7qA"
    store = open_object_store(config.storage.object_store_url)
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.endpoint, store.region) == (
        "automq",
        "http://192.168.31.129:9000",
        "ignore-here",
    )


def test_s3_url_keeps_plus_and_slash_in_secret_keys() -> None:
    url = "s3://s3.amazonaws.com?s3-access-key=AK&s3-secret-key=a+b/c%3D&s3-data-bucket=b"
    data_url = s3_url_properties(url)["s3.data.buckets"].removeprefix("0@")
    query = parse_qs(urlsplit(data_url).query)
    assert query["secretKey"] == ["a+b/c="]
    assert query["endpoint"] == ["https://s3.amazonaws.com"]
    assert query["pathStyle"] == ["false"]  # AutoMQ's default for --s3-path-style


def test_s3_url_is_applied_after_overrides() -> None:
    config = BrokerConfig.load(overrides=["cluster.id=mine"], s3_url=SEED_S3_URL)
    assert config.cluster_id == "5kilSYquT962mUNQ8dL7qA"


def test_s3_url_without_a_data_bucket_is_an_error_that_hides_the_secret() -> None:
    with pytest.raises(ConfigError, match="s3-data-bucket") as e:
        BrokerConfig.load(s3_url="s3://127.0.0.1:9000?s3-access-key=AK&s3-secret-key=TOPSECRET")
    assert "TOPSECRET" not in str(e.value)


def test_credentials_come_from_automqs_environment_variables_when_the_url_has_none() -> None:
    env = {"KAFKA_S3_ACCESS_KEY": "AK", "KAFKA_S3_SECRET_KEY": "S+K"}
    url = "0@s3://bucket?endpoint=http://127.0.0.1:8333"
    config = BrokerConfig.load(overrides=[f"s3.data.buckets={url}"], env=env)
    query = parse_qs(urlsplit(config.storage.object_store_url).query)
    assert (query["accessKey"], query["secretKey"]) == (["AK"], ["S+K"])
    # Keys written in the url win over the environment.
    assert BrokerConfig.load(s3_url=SEED_S3_URL, env=env).storage.data_url.endswith(
        "accessKey=minioadmin&secretKey=minioadmin"
    )


def test_kafka_environment_variables_map_to_properties_as_kafka_images_do() -> None:
    env = {
        "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://localhost:32768",
        "KAFKA_S3_WAL_CAPACITY": "67108864",
        "KAFKA_CONFLUENT_SUPPORT___METRICS__ENABLE": "false",
        "KAFKA_HEAP_OPTS": "-Xmx1G",  # the JVM's, not a property
        "KAFKA_S3_ACCESS_KEY": "AK",  # credentials, not properties
        "KAFKA_S3_SECRET_KEY": "SK",
        "PATH": "/usr/bin",
    }
    assert env_properties(env) == {
        "advertised.listeners": "PLAINTEXT://localhost:32768",
        "s3.wal.capacity": "67108864",
        "confluent.support-metrics_enable": "false",
    }


def test_environment_properties_apply_only_with_from_env_and_under_overrides() -> None:
    env = {"KAFKA_NUM_PARTITIONS": "4", "KAFKA_NODE_ID": "7", "AUTOMQ_S3_URL": SEED_S3_URL}
    assert BrokerConfig.load(env=env).num_partitions == 1
    config = BrokerConfig.load(overrides=["node.id=3"], env=env, from_env=True)
    assert (config.num_partitions, config.node_id) == (4, 3)
    assert config.cluster_id == "5kilSYquT962mUNQ8dL7qA"  # AUTOMQ_S3_URL is --s3-url
    with pytest.raises(ConfigError, match=r"num\.partitions"):
        BrokerConfig.load(env={"KAFKA_NUM_PARTITIONS": "many"}, from_env=True)


# --- derived values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("props", "expected_ms"),
    [
        ({}, 168 * 3_600_000),
        ({"log.retention.hours": "1"}, 3_600_000),
        ({"log.retention.hours": "1", "log.retention.minutes": "2"}, 120_000),
        (
            {"log.retention.hours": "1", "log.retention.minutes": "2", "log.retention.ms": "5"},
            5,
        ),
        ({"log.retention.hours": "-1"}, -1),
        ({"log.retention.ms": "-7"}, -1),
    ],
)
def test_retention_ms_wins_over_minutes_over_hours(props: dict[str, str], expected_ms: int) -> None:
    config = BrokerConfig.from_properties(props)
    assert config.topic_defaults()["retention.ms"] == str(expected_ms)


def test_roll_ms_wins_over_roll_hours() -> None:
    def segment_ms(props: dict[str, str]) -> str:
        return BrokerConfig.from_properties(props).topic_defaults()["segment.ms"]

    assert segment_ms({"log.roll.hours": "2"}) == "7200000"
    assert segment_ms({"log.roll.hours": "2", "log.roll.ms": "1000"}) == "1000"
    assert segment_ms({"log.roll.jitter.hours": "1"}) == segment_ms({})  # another config


def test_every_topic_config_takes_its_default_from_its_broker_synonym() -> None:
    """Kafka's ServerTopicConfigSynonyms: each broker property sets its topic config's
    default, converted from hours or minutes where it is in them."""
    props = {
        "log.roll.jitter.hours": "2",
        "log.index.size.max.bytes": "4096",
        "log.flush.scheduler.interval.ms": "900",
        "log.cleaner.delete.retention.ms": "5",
        "log.cleaner.min.compaction.lag.ms": "6",
        "log.cleaner.max.compaction.lag.ms": "7",
        "log.segment.delete.delay.ms": "8",
        "log.cleaner.min.cleanable.ratio": "0.25",
        "min.insync.replicas": "2",
        "compression.type": "zstd",
        "compression.zstd.level": "7",
        "log.preallocate": "true",
        "log.message.timestamp.before.max.ms": "9",
        "log.message.downconversion.enable": "false",
        "log.local.retention.ms": "10",
    }
    defaults = BrokerConfig.from_properties(props).topic_defaults()
    assert defaults["segment.jitter.ms"] == "7200000"
    assert defaults["segment.index.bytes"] == "4096"
    assert defaults["flush.ms"] == "900"  # log.flush.interval.ms is unset: the next synonym
    assert defaults["delete.retention.ms"] == "5"
    assert defaults["min.compaction.lag.ms"] == "6"
    assert defaults["max.compaction.lag.ms"] == "7"
    assert defaults["file.delete.delay.ms"] == "8"
    assert defaults["min.cleanable.dirty.ratio"] == "0.25"
    assert defaults["min.insync.replicas"] == "2"
    assert defaults["compression.type"] == "zstd"
    assert defaults["compression.zstd.level"] == "7"
    assert defaults["preallocate"] == "true"
    assert defaults["message.timestamp.before.max.ms"] == "9"
    assert defaults["message.downconversion.enable"] == "false"
    assert defaults["local.retention.ms"] == "10"
    assert BrokerConfig.from_properties({}).topic_defaults()["flush.ms"] == str((1 << 63) - 1)


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"log.cleaner.min.cleanable.ratio": "2"}, "log.cleaner.min.cleanable.ratio: must be"),
        ({"compression.gzip.level": "12"}, "compression.gzip.level: must be -1 or in 1..9"),
        ({"log.roll.jitter.hours": "-1"}, "log.roll.jitter.hours: must be at least 0"),
        ({"log.message.format.version": "banana"}, "log.message.format.version: expected"),
        (
            {"log.cleaner.min.compaction.lag.ms": "9", "log.cleaner.max.compaction.lag.ms": "5"},
            "log.cleaner.min.compaction.lag.ms: conflict",
        ),
    ],
)
def test_a_bad_broker_synonym_is_named(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        BrokerConfig.from_properties(props)


def test_storage_defaults_live_under_the_data_directory(tmp_path: Path) -> None:
    config = BrokerConfig.load(overrides=[f"log.dirs={tmp_path}/d", "node.id=2"])
    assert config.data_dir == f"{tmp_path}/d"
    assert config.storage.wal_path == f"{tmp_path}/d/wal"
    assert sqlite_path(config.storage.metadata_url) == f"{tmp_path}/d/metadata.db"
    store = open_object_store(config.storage.object_store_url)
    assert isinstance(store, LocalObjectStore)
    assert config.storage.object_store_url == (tmp_path / "d" / "objects").as_uri()
    assert config.storage.node_id == 2


def test_a_relative_data_directory_gives_absolute_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = BrokerConfig.load()
    assert config.data_dir == "./data"
    assert config.storage.wal_path == "./data/wal"
    assert config.storage.metadata_url == f"sqlite://{tmp_path}/data/metadata.db"
    assert config.storage.data_url == f"file://{tmp_path}/data/objects"


def test_log_dirs_wins_over_log_dir_and_explicit_storage_settings_are_kept() -> None:
    config = BrokerConfig.from_properties(
        {
            "log.dir": "/a",
            "log.dirs": "/b",
            "s3.wal.path": "/fast/wal",
            "s3.wal.capacity": "4294967296",
        }
    )
    assert config.data_dir == "/b"
    assert config.storage.wal_path == "/fast/wal"
    assert config.storage.wal_capacity == 4 << 30
    assert config.storage.metadata_url == "sqlite:///b/metadata.db"


def test_topic_defaults_are_what_logconfig_reads() -> None:
    config = BrokerConfig.from_properties(
        {
            "log.segment.bytes": "1048576",
            "log.retention.bytes": "5000",
            "log.index.interval.bytes": "100",
            "message.max.bytes": "2048",
            "log.cleanup.policy": "compact",
            "log.message.timestamp.type": "LogAppendTime",
            "log.roll.ms": "60000",
        }
    )
    log_config = LogConfig.from_properties(config.topic_defaults(), strict=True)
    assert log_config == LogConfig(
        segment_bytes=1048576,
        segment_ms=60000,
        retention_ms=168 * 3_600_000,
        retention_bytes=5000,
        index_interval_bytes=100,
        max_message_bytes=2048,
        message_timestamp_type="LogAppendTime",
        cleanup_policy=("compact",),
    )


def test_all_properties_lists_effective_values_and_hides_secrets() -> None:
    config = BrokerConfig.load(
        overrides=["log.retention.minutes=3", "some.unknown=x", "ssl.keystore.password=pw"],
        s3_url=SEED_S3_URL,
    )
    props = config.all_properties()
    # each property as set (Kafka shows an unset log.retention.ms as null); in effect: 3 min
    assert props["log.retention.minutes"] == "3"
    assert props["log.retention.hours"] == "168"
    assert "log.retention.ms" not in props
    assert config.topic_defaults()["retention.ms"] == "180000"
    assert props["num.partitions"] == "1"
    assert props["some.unknown"] == "x"
    assert props["ssl.keystore.password"] == "[hidden]"
    assert "secretKey=[hidden]" in props["s3.data.buckets"]
    assert "minioadmin&secretKey" in props["s3.data.buckets"]  # the access key is no secret
    assert config.all_properties(redact=False)["s3.data.buckets"].endswith("secretKey=minioadmin")


def test_every_stores_url_hides_its_secrets() -> None:
    """DescribeConfigs shows a broker's properties to any principal allowed DESCRIBE_CONFIGS:
    the metadata database's password (its ACLs and SCRAM credentials are there) and the
    object WAL's secret key are hidden as the data buckets' is."""
    config = BrokerConfig.load(
        overrides=[
            "metadata.store.url=postgresql://automq:pg-pass@db:5432/automq",
            "s3.wal.path=0@s3://wal?endpoint=http://h:8333&accessKey=AK&secretKey=wal-secret",
        ],
        s3_url=SEED_S3_URL,
    )
    shown = " ".join(config.all_properties().values())
    assert "pg-pass" not in shown and "wal-secret" not in shown
    props = config.all_properties()
    assert props["metadata.store.url"] == "postgresql://automq:[hidden]@db:5432/automq"
    assert props["s3.wal.path"].endswith("accessKey=AK&secretKey=[hidden]")
    assert config.all_properties(redact=False)["metadata.store.url"].endswith(
        ":pg-pass@db:5432/automq"
    )


def test_unknown_properties_are_kept_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="automq.config"):
        config = BrokerConfig.load(overrides=["process.roles=broker", "process.roles=broker,x"])
    assert config.properties["process.roles"] == "broker,x"
    assert [r.getMessage() for r in caplog.records] == [
        "property 'process.roles' is not used by automq-py; ignored"
    ]


# --- listeners ----------------------------------------------------------------------------------


def test_listeners_parse_and_advertised_defaults_to_listeners() -> None:
    config = BrokerConfig.from_properties(
        {"listeners": "plaintext://127.0.0.1:9092", "log.dirs": "/tmp/x"}
    )
    assert config.listeners == (Listener("PLAINTEXT", "127.0.0.1", 9092),)
    assert config.advertised_listeners == config.listeners


def test_an_empty_host_binds_every_interface_but_must_not_be_advertised() -> None:
    with pytest.raises(ConfigError, match=r"advertised\.listeners.*0\.0\.0\.0"):
        BrokerConfig.from_properties({"listeners": "PLAINTEXT://:9092"})
    config = BrokerConfig.from_properties(
        {
            "listeners": "PLAINTEXT://:9092",
            "advertised.listeners": "PLAINTEXT://broker1.example.com:19092",
        }
    )
    assert config.listeners == (Listener("PLAINTEXT", "0.0.0.0", 9092),)
    assert config.advertised_listeners == (Listener("PLAINTEXT", "broker1.example.com", 19092),)


def test_ipv6_listeners_and_their_string_form() -> None:
    config = BrokerConfig.from_properties({"listeners": "PLAINTEXT://[::1]:9092"})
    assert config.listeners == (Listener("PLAINTEXT", "::1", 9092),)
    assert str(config.listeners[0]) == "PLAINTEXT://[::1]:9092"
    with pytest.raises(ConfigError, match=r"advertised\.listeners"):
        BrokerConfig.from_properties({"listeners": "PLAINTEXT://[::]:9092"})


def test_a_controller_listener_is_not_advertised() -> None:
    # The shape of AutoMQ's generate-start-command output.
    config = BrokerConfig.from_properties(
        {
            "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            "controller.listener.names": "CONTROLLER",
        }
    )
    assert [x.name for x in config.listeners] == ["PLAINTEXT", "CONTROLLER"]
    assert config.advertised_listeners == (Listener("PLAINTEXT", "127.0.0.1", 9092),)


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"listeners": "127.0.0.1:9092"}, r"listeners: expected NAME://HOST:PORT"),
        ({"listeners": "PLAINTEXT://h:x"}, r"listeners: bad port 'x'"),
        ({"listeners": "PLAINTEXT://h:\u0661"}, r"listeners: bad port"),
        ({"listeners": "PLAINTEXT://h:70000"}, r"listeners: port must be in 0\.\.65535"),
        ({"listeners": "PLAINTEXT://a:1,PLAINTEXT://b:2"}, r"listeners: .*PLAINTEXT repeats"),
        ({"listeners": "SSL://h:9093"}, r"ssl\.keystore\.location: listener SSL uses SSL"),
        (
            {"listeners": "X://h:9093", "listener.security.protocol.map": "X:TLS"},
            r"listener\.security\.protocol\.map: X:TLS is no security protocol",
        ),
        (
            {"listeners": "SASL_PLAINTEXT://h:9093"},
            r"sasl\.enabled\.mechanisms: listener SASL_PLAINTEXT enables GSSAPI",
        ),
        (
            {"listeners": "SASL_PLAINTEXT://h:9093", "sasl.enabled.mechanisms": "PLAIN"},
            r"listener\.name\.sasl_plaintext\.plain\.sasl\.jaas\.config",
        ),
        (
            {"authorizer.class.name": "com.example.MyAuthorizer"},
            r"authorizer\.class\.name: 'com\.example\.MyAuthorizer'",
        ),
        ({"listeners": "INTERNAL://h:9093"}, r"listener\.security\.protocol\.map"),
        ({"advertised.listeners": "OTHER://h:1"}, r"advertised\.listeners: OTHER://h:1 names no"),
        ({"controller.listener.names": "PLAINTEXT"}, r"controller\.listener\.names"),
    ],
)
def test_bad_listeners_name_the_property(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BrokerConfig.from_properties(props)


def test_a_mapped_listener_name_is_accepted() -> None:
    config = BrokerConfig.from_properties(
        {
            "listeners": "INTERNAL://127.0.0.1:9092",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT",
        }
    )
    assert config.listeners == (Listener("INTERNAL", "127.0.0.1", 9092),)


# --- errors name the property and the value ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("num.partitions", "abc", r"num\.partitions: expected an integer, got 'abc'"),
        ("num.partitions", "0", r"num\.partitions: must be at least 1, got 0"),
        ("num.partitions", "4294967296", r"num\.partitions: must fit in a int"),
        ("delete.topic.enable", "yes", r"delete\.topic\.enable: expected true or false"),
        ("log.retention.hours", "1.5", r"log\.retention\.hours: expected an integer, got '1\.5'"),
        ("log.roll.ms", "0", r"log\.roll\.ms: must be at least 1"),
        ("log.segment.bytes", "10", r"log\.segment\.bytes: must be at least 14"),
        ("log.cleanup.policy", "forever", r"log\.cleanup\.policy: .*'forever'"),
        ("log.message.timestamp.type", "Now", r"log\.message\.timestamp\.type: .*'Now'"),
        ("log.dirs", "/a,/b", r"log\.dirs: expected one directory"),
        ("s3.wal.capacity", "big", r"s3\.wal\.capacity: expected an integer, got 'big'"),
        ("cluster.id", "a b", r"cluster\.id must be letters"),
    ],
)
def test_errors_name_the_property_and_the_value(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BrokerConfig.load(overrides=[f"{name}={value}"])


def test_default_replication_factor_is_accepted_and_ignored() -> None:
    config = BrokerConfig.load(overrides=["default.replication.factor=3"])
    assert config.default_replication_factor == 3


def test_the_config_is_frozen() -> None:
    config = BrokerConfig.load()
    with pytest.raises(AttributeError):
        config.num_partitions = 2  # type: ignore[misc]


# --- the serve command ----------------------------------------------------------------------------


def test_serve_help_describes_each_option() -> None:
    out = run_cli("serve", "--help")
    assert out.returncode == 0, out.stderr
    for text in ("--config", "--override KEY=VALUE", "--s3-url URL", "num.partitions=3"):
        assert text in out.stdout
    assert "s3-data-bucket=" in out.stdout


def test_serve_with_a_bad_property_exits_2_naming_it(tmp_path: Path) -> None:
    out = run_cli("serve", "--override", "num.partitions=abc", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("automq-py serve: num.partitions: expected an integer, got 'abc'")
    assert not (tmp_path / "data").exists()


def test_serve_with_a_missing_config_file_exits_2_naming_it(tmp_path: Path) -> None:
    out = run_cli("serve", "-c", str(tmp_path / "missing.properties"), cwd=tmp_path)
    assert out.returncode == 2
    assert "missing.properties" in out.stderr


# --- fuzz: any value of any property, a config or an error naming the property ---------------


@given(st.sampled_from(sorted(BrokerConfig.config_keys())), raw_text)
def test_any_broker_property_value_gives_a_config_or_an_error_naming_it(
    name: str, raw: str
) -> None:
    try:
        BrokerConfig.from_properties({name: raw})
    except ConfigError as e:
        assert name in str(e)


def test_the_wal_is_zero_filled_unless_told_not_to() -> None:
    assert BrokerConfig.from_properties({}).storage.wal_init_zero is True
    config = BrokerConfig.from_properties({"s3.wal.init.zero": "false"})
    assert config.storage.wal_init_zero is False
    with pytest.raises(ConfigError, match=r"s3\.wal\.init\.zero"):
        BrokerConfig.from_properties({"s3.wal.init.zero": "sometimes"})


def test_the_wals_io_workers_run_at_real_time_priority_unless_told_not_to() -> None:
    assert BrokerConfig.from_properties({}).storage.wal_io_realtime is True
    config = BrokerConfig.from_properties({"s3.wal.io.realtime": "false"})
    assert config.storage.wal_io_realtime is False
    with pytest.raises(ConfigError, match=r"s3\.wal\.io\.realtime"):
        BrokerConfig.from_properties({"s3.wal.io.realtime": "maybe"})


def test_an_inter_broker_listener_asking_for_sasl_is_refused_where_spark_executors_connect() -> (
    None
):
    from automq_py.broker import _check_inter_broker_listener

    props = {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:9094",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="b";'
        ),
    }
    for runner in ("none", "local"):  # nobody, or clients of this process that authenticate
        config = BrokerConfig.from_properties({**props, "s3.maintenance.runner": runner})
        _check_inter_broker_listener(config, "SASL_PLAINTEXT")
    with_spark = BrokerConfig.from_properties({**props, "s3.maintenance.runner": "spark"})
    with pytest.raises(ConfigError, match=r"inter\.broker\.listener\.name: .*SASL_PLAINTEXT"):
        _check_inter_broker_listener(with_spark, "SASL_PLAINTEXT")


def test_brokers_authenticate_to_each_other_as_their_jaas_config_says() -> None:
    from automq_py.network.listeners import inter_broker_security

    props = {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:9094",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            'username="broker" password="pw" user_broker="pw";'
        ),
    }
    security = inter_broker_security(BrokerConfig.from_properties(props), "SASL_PLAINTEXT")
    assert security is not None
    assert (security.sasl_mechanism, security.username, security.password) == (
        "PLAIN",
        "broker",
        "pw",
    )
    no_user = {
        **props,
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="b";'
        ),
    }
    with pytest.raises(ConfigError, match=r"plain\.sasl\.jaas\.config: the broker's own"):
        inter_broker_security(BrokerConfig.from_properties(no_user), "SASL_PLAINTEXT")
    gssapi = {**props, "sasl.mechanism.inter.broker.protocol": "GSSAPI"}
    with pytest.raises(ConfigError, match=r"sasl\.mechanism\.inter\.broker\.protocol"):
        inter_broker_security(BrokerConfig.from_properties(gssapi), "SASL_PLAINTEXT")


def test_socket_buffer_sizes_take_kafkas_names_and_minus_one_for_the_os_default() -> None:
    config = BrokerConfig.from_properties({})
    assert (config.socket_send_buffer_bytes, config.socket_receive_buffer_bytes) == (102400, -1)
    config = BrokerConfig.from_properties(
        {"socket.send.buffer.bytes": "-1", "socket.receive.buffer.bytes": "65536"}
    )
    assert (config.socket_send_buffer_bytes, config.socket_receive_buffer_bytes) == (-1, 65536)
    for name in ("socket.send.buffer.bytes", "socket.receive.buffer.bytes"):
        for bad in ("0", "-2"):
            with pytest.raises(ConfigError, match=rf"^{name}: must be -1 \(the OS default\)"):
                BrokerConfig.from_properties({name: bad})


def test_a_sasl_ssl_listener_asks_for_certificates_only_by_its_own_setting() -> None:
    """Kafka's ChannelBuilders: the unprefixed ssl.client.auth is the SSL listeners'; a
    SASL_SSL listener asks clients for certificates only by listener.name.<l>.ssl.client.auth
    (its clients authenticate with SASL, and most have no certificate)."""
    props = {
        "listeners": "SSL://127.0.0.1:9093,SASL_SSL://127.0.0.1:9094",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": "/certs/server.pem",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/certs/ca.pem",
        "ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": (
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="b";'
        ),
    }

    def client_auth(config: BrokerConfig, listener: str) -> str:
        ssl = config.security.listener(listener).ssl
        assert ssl is not None
        return ssl.client_auth

    config = BrokerConfig.from_properties(props)
    assert (client_auth(config, "SSL"), client_auth(config, "SASL_SSL")) == ("required", "none")
    own = BrokerConfig.from_properties(
        {**props, "listener.name.sasl_ssl.ssl.client.auth": "requested"}
    )
    assert client_auth(own, "SASL_SSL") == "requested"


def test_connections_max_reauth_ms_per_listener_and_mechanism() -> None:
    """Kafka's SaslChannelBuilder.createConnectionsMaxReauthMsMap: a mechanism's own
    connections.max.reauth.ms, then the listener's; the others take the broker's."""
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="b";'
    props = {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:9094",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,OAUTHBEARER",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        "connections.max.reauth.ms": "600000",
        "listener.name.sasl_plaintext.plain.connections.max.reauth.ms": "30000",
    }
    sasl = BrokerConfig.from_properties(props).security.listener("SASL_PLAINTEXT").sasl
    assert sasl is not None and dict(sasl.max_reauth_ms) == {"PLAIN": 30000}
    listener_wide = {**props, "listener.name.sasl_plaintext.connections.max.reauth.ms": "60000"}
    sasl = BrokerConfig.from_properties(listener_wide).security.listener("SASL_PLAINTEXT").sasl
    assert sasl is not None
    assert dict(sasl.max_reauth_ms) == {
        "PLAIN": 30000,
        "SCRAM-SHA-256": 60000,
        "OAUTHBEARER": 60000,
    }
    bad = {**props, "listener.name.sasl_plaintext.plain.connections.max.reauth.ms": "soon"}
    with pytest.raises(
        ConfigError, match=r"listener\.name\.sasl_plaintext\.plain\.connections\.max\.reauth\.ms"
    ):
        BrokerConfig.from_properties(bad)
