"""``log.format=json`` and per-logger levels: the formatter alone, and a real broker's stderr."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from confluent_kafka import Producer

from automq_py.config import BrokerConfig, ConfigError
from automq_py.logs import JsonFormatter, logger_levels
from tests.automq_py.conftest import MakeBroker


def test_a_json_line_has_what_a_log_pipeline_expects() -> None:
    formatter = JsonFormatter({"node_id": 3, "cluster_id": "c"})
    record = logging.LogRecord("automq.wal", logging.WARNING, "f.py", 1, "slow: %d ms", (42,), None)
    entry = json.loads(formatter.format(record))
    assert entry["level"] == "WARNING" and entry["logger"] == "automq.wal"
    assert entry["message"] == "slow: 42 ms"
    assert entry["node_id"] == 3 and entry["cluster_id"] == "c"
    assert entry["timestamp"].endswith("Z") and len(entry["timestamp"]) == 24
    try:
        raise ValueError('bad "quotes"\nand lines')
    except ValueError:
        failed = logging.LogRecord(
            "automq.x", logging.ERROR, "f.py", 1, "failed", (), sys.exc_info()
        )
    line = formatter.format(failed)
    assert "\n" not in line  # one line per record, whatever the message holds
    assert "ValueError: bad" in json.loads(line)["exception"]


def test_levels_per_logger_and_bad_values_name_the_property() -> None:
    assert logger_levels({"log.level.automq.wal": "debug", "log.dirs": "x"}) == {
        "automq.wal": "DEBUG"
    }
    config = BrokerConfig.load(overrides=["log.level.automq.wal=DEBUG", "log.format=json"])
    assert config.logger_levels == {"automq.wal": "DEBUG"} and config.log_format == "json"
    with pytest.raises(ConfigError, match=r"log\.level\.automq\.wal"):
        BrokerConfig.load(overrides=["log.level.automq.wal=LOUD"])
    with pytest.raises(ConfigError, match=r"log\.format"):
        BrokerConfig.load(overrides=["log.format=xml"])


@pytest.mark.integration
def test_a_broker_logs_json_lines_at_the_levels_configured(make_broker: MakeBroker) -> None:
    broker = make_broker(
        **{
            "s3.wal.upload.threshold": str(1 << 20),  # the upload worker uploads the 2 MiB
            "log.format": "json",
            "log.level.automq.broker": "WARNING",
            "log.level.automq.network": "DEBUG",
        }
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for _ in range(20):
        producer.produce("logged", b"u" * 100_000)
    assert producer.flush(30) == 0
    del producer  # (no reconnecting to a stopped broker)
    assert broker.stop() == 0
    lines = broker.log_path.read_text().splitlines()
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(entries) > 10
    # every line of the broker process is JSON (the upload worker's included)
    assert [line for line in lines if not line.startswith("{")] == []
    loggers = {(e["logger"], e["level"]) for e in entries}
    assert not any(logger == "automq.broker" and level == "INFO" for logger, level in loggers)
    assert ("automq.network", "INFO") in loggers  # "listening on"
    assert all(e["node_id"] == 0 for e in entries)
    worker = [e for e in entries if e["message"].startswith("upload worker: ")]
    assert worker and worker[0]["thread"] == "MainThread", entries[-5:]  # the worker's own
