"""docker/grafana/automq-py.json: a dashboard Grafana 10+ imports (a data source variable, a
broker variable, panels on a 24-column grid), whose every query is PromQL that a real
Prometheus accepts and, scraping a broker under a short load, answers with data.

No container engine: the broker and Prometheus (Debian's package) run as processes here.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.automq_py.conftest import start_broker
from tests.support.broker import REPO, free_port
from tests.support.prometheus import Prometheus
from tests.support.seaweedfs import SeaweedFS

DASHBOARD = REPO / "docker" / "grafana" / "automq-py.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# what Grafana fills in itself; the rate interval spans the whole load below
BUILTINS = {"__rate_interval": "10s", "__interval": "1s", "__range": "1h"}
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
LABEL_VALUES = re.compile(r"label_values\((.+),\s*(\w+)\)")

RECORD = b"d" * 1000
FIRST = 3000  # records the group reads (the first ones from object storage) and commits
MORE = 1000  # records produced after the commit: the group's lag
# every query of these panels has a value above zero after the load
MOVING = {
    "Messages in",
    "Bytes in",
    "Bytes out",
    "Consumer lag",
    "Messages in per second, by topic",
    "Bytes out per second, by topic",
    "Produce time (TotalTimeMs)",
    "Consumer lag, by group",
    "WAL append latency",
    "S3 requests per second, by operation",
    "S3 bytes per second",
    "Runs in the last hour, by step",
    "Resident memory",
}


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but the rows, those inside collapsed rows too."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every target."""
    for panel in panels(dashboard):
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return query["query"] if isinstance(query, dict) else str(query)


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with ``$name`` and ``${name}`` replaced as Grafana does (KeyError for a name
    with no value)."""
    return VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], expr)


def regex_value(value: str) -> str:
    """One selected value of a multi-value variable in an ``=~`` matcher, escaped as Grafana's
    Prometheus data source escapes it (a regex inside a PromQL string)."""
    return re.escape(value).replace("\\", "\\\\")


def test_the_dashboard_is_in_the_form_grafana_imports() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "automq-py"
    assert dashboard["schemaVersion"] >= 38  # Grafana 10's
    defined = variables(dashboard)
    assert defined["DS_PROMETHEUS"]["type"] == "datasource"
    assert defined["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("instance", "consumergroup"):
        assert defined[name]["type"] == "query"
        assert defined[name]["datasource"] == DATASOURCE
        assert LABEL_VALUES.fullmatch(variable_query(defined[name])), name

    ids = [p["id"] for p in dashboard["panels"]] + [
        p["id"] for row in dashboard["panels"] for p in row.get("panels", [])
    ]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                assert (x, y) not in cells, (panel["title"], cells[(x, y)])
                cells[(x, y)] = panel["title"]

    titles = [p["title"] for p in panels(dashboard)]
    assert len(titles) == len(set(titles))
    assert set(titles) >= MOVING
    for panel in panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            # every variable a query names is the dashboard's or Grafana's own
            names = {a or b for a, b in VARIABLE.findall(target["expr"])}
            assert names <= {*defined, *BUILTINS}, (panel["title"], names)
            assert 'instance=~"$instance"' in target["expr"], panel["title"]


def produce(bootstrap: str, topic: str, count: int, rounds: int = 1) -> None:
    """``count`` records over both partitions, in ``rounds`` half a second apart (so that
    counters move over several scrapes)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for r in range(rounds):
        if r:
            time.sleep(0.5)
        for i in range(count // rounds):
            producer.produce(topic, RECORD, partition=i % 2)
        assert producer.flush(30) == 0


def read_and_commit(bootstrap: str, topic: str, group: str, count: int) -> None:
    """``group`` reads both partitions from the start, ``count`` records, and commits."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    read: dict[int, int] = {}
    deadline = time.monotonic() + 30
    while sum(read.values()) < count and time.monotonic() < deadline:
        for m in consumer.consume(500, 0.5):
            assert m.error() is None, m.error()
            read[m.partition()] = m.offset() + 1
    assert sum(read.values()) == count
    consumer.commit(
        offsets=[TopicPartition(topic, p, o) for p, o in read.items()], asynchronous=False
    )
    consumer.close()


@pytest.mark.integration
def test_every_query_of_the_dashboard_has_data_over_a_loaded_broker(
    tmp_path: Path, s3_server: SeaweedFS
) -> None:
    dashboard = load_dashboard()
    metrics_port = free_port()
    instance = f"127.0.0.1:{metrics_port}"
    topic = f"dash-{uuid.uuid4().hex[:6]}"
    group = f"dash-{uuid.uuid4().hex[:6]}"
    values = {**BUILTINS, "instance": regex_value(instance), "consumergroup": regex_value(group)}
    # Prometheus first: it takes ~5 s to scrape a new target, the broker ~2 s to start
    with Prometheus(tmp_path / "prometheus", [instance]) as prometheus:
        broker = start_broker(
            tmp_path / "broker",
            s3_server,
            **{
                "metrics.port": str(metrics_port),
                # uploads all through the load, and a LogCache too small to keep it: the group
                # reads the first records back from object storage through the block cache
                "s3.wal.upload.threshold": str(256 << 10),
                "s3.wal.cache.size": str(1 << 20),
                # retention and GC every second: maintenance series to show
                "log.retention.check.interval.ms": "1000",
                "s3.maintenance.runner": "local",
            },
        )
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
            prometheus.wait_for('up{job="automq"} == 1')
            produce(broker.bootstrap, topic, FIRST, rounds=4)
            read_and_commit(broker.bootstrap, topic, group, FIRST)
            produce(broker.bootstrap, topic, MORE)
            # maintenance runs in two scrapes (increase() needs two), then two more scrapes
            prometheus.wait_for("sum(increase(automq_maintenance_runs_total[1h])) > 0")
            # the group's committed offsets in two scrapes of the panels' 10 s window: rate()
            # needs two, and on a busy machine a scrape can come late
            prometheus.wait_for(
                f'count_over_time(kafka_consumergroup_current_offset{{consumergroup="{group}",'
                'partition="0"}[10s]) >= 2'
            )
            time.sleep(2 * prometheus.interval_s)

            # the variables' own queries list the broker and the group
            for name, expected in (("instance", instance), ("consumergroup", group)):
                query = LABEL_VALUES.fullmatch(variable_query(variables(dashboard)[name]))
                assert query is not None
                selector, label = query.groups()
                found = prometheus.query(substitute(selector, values))
                assert expected in {s["metric"].get(label) for s in found}, (name, found)

            refused: list[str] = []
            empty: list[str] = []
            still: list[str] = []
            answered = 0
            for title, expr in queries(dashboard):
                promql = substitute(expr, values)
                try:
                    result = prometheus.query(promql)
                except urllib.error.HTTPError as e:  # 400 bad_data: not PromQL
                    refused.append(f"{title}: {promql}: {e.read().decode()}")
                    continue
                answered += 1
                numbers = [float(s["value"][1]) for s in result]
                if not any(math.isfinite(n) for n in numbers):
                    empty.append(f"{title}: {promql} -> {result}")
                elif title in MOVING and not any(n > 0 for n in numbers):
                    still.append(f"{title}: {promql} -> {result}")
            lag = prometheus.value(
                substitute(
                    'sum(kafka_consumergroup_lag_sum{consumergroup=~"$consumergroup"})', values
                )
            )
        finally:
            assert broker.stop() == 0, broker.log_tail()
    print(f"\n{answered} queries, each with data")
    assert not refused, "\n".join(refused)
    assert not empty, "\n".join(empty)
    assert not still, "\n".join(still)
    assert lag == MORE
