"""S3StreamConfig: property names, defaults, and errors that name the property."""

from __future__ import annotations

import pytest

from storage.config import ConfigError, S3StreamConfig


def test_defaults_follow_automq() -> None:
    c = S3StreamConfig()
    assert c.stream_object_split_size == 8 << 20
    assert c.object_block_size == 512 << 10
    assert c.object_part_size == 16 << 20
    assert c.namespace == "_kafka_automq-py"


def test_from_properties_reads_kafka_names() -> None:
    c = S3StreamConfig.from_properties(
        {
            "node.id": "2",
            "cluster.id": "abc",
            "s3.data.buckets": "0@s3://b?endpoint=http://127.0.0.1:1&region=r",
            "s3.wal.upload.threshold": "1048576",
            "unrelated.kafka.property": "x",
        }
    )
    assert (c.node_id, c.namespace, c.wal_upload_threshold) == (2, "_kafka_abc", 1 << 20)
    assert c.object_store_url == "s3://b?endpoint=http://127.0.0.1:1&region=r"


@pytest.mark.parametrize(
    ("props", "named"),
    [
        ({"s3.wal.upload.threshold": "lots"}, "s3.wal.upload.threshold"),
        ({"s3.object.block.size": "0"}, "s3.object.block.size"),
        ({"s3.object.part.size": "1024"}, "s3.object.part.size"),
        ({"s3.data.buckets": "ftp://x"}, "s3.data.buckets"),
        ({"s3.wal.upload.threshold": str(1 << 40)}, "s3.wal.upload.threshold"),
        ({"cluster.id": "a/b"}, "cluster.id"),
    ],
)
def test_bad_values_name_the_property(props: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        S3StreamConfig.from_properties(props)


@pytest.mark.parametrize(
    ("path", "url"),
    [
        ("./data/wal", None),
        ("/var/lib/wal", None),
        (
            "0@s3://bucket?region=us-east-1&endpoint=http://127.0.0.1:8333",
            "s3://bucket?region=us-east-1&endpoint=http://127.0.0.1:8333",
        ),
        ("s3://bucket", "s3://bucket"),
        ("0@file:///tmp/wal-objects", "file:///tmp/wal-objects"),
    ],
)
def test_s3_wal_path_names_a_directory_or_a_bucket(path: str, url: str | None) -> None:
    config = S3StreamConfig.from_properties({"s3.wal.path": path})
    assert config.wal_object_store_url == url


def test_object_wal_properties() -> None:
    config = S3StreamConfig()
    assert config.wal_object_batch_interval_ms == 5
    assert config.wal_object_batch_size == 4 << 20
    assert config.wal_object_max_inflight_uploads == 8
    config = S3StreamConfig.from_properties(
        {"s3.wal.object.batch.interval.ms": "0", "s3.wal.object.batch.size": "1048576"}
    )
    assert (config.wal_object_batch_interval_ms, config.wal_object_batch_size) == (0, 1 << 20)
    with pytest.raises(ConfigError, match=r"s3\.wal\.object\.batch\.interval\.ms"):
        S3StreamConfig.from_properties({"s3.wal.object.batch.interval.ms": "-1"})
    with pytest.raises(ConfigError, match=r"s3\.wal\.path"):
        S3StreamConfig.from_properties({"s3.wal.path": "0@http://bucket"})
