"""docker/compose.yml read as a file: the default ``up`` is one broker on SeaweedFS, the
``cluster`` profile adds PostgreSQL and three brokers of one cluster, the ``monitoring`` profile
Prometheus and Grafana. No container engine: the
file is parsed as YAML (anchors resolved), ``${VAR:-default}`` read as its default."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # podman-compose's dependency

from tests.support.broker import REPO

DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yml"
CLUSTER_BROKERS = ("broker-0", "broker-1", "broker-2")


def _default(value: str) -> str:
    """``value`` with each ``${VAR:-default}`` replaced by its default, as with VAR unset."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]  # type: ignore[no-any-return]


def test_the_default_up_is_one_broker_on_seaweedfs(services: dict[str, dict[str, Any]]) -> None:
    always = {name for name, service in services.items() if not service.get("profiles")}
    assert always == {"s3", "broker"}
    broker = services["broker"]
    assert _default(broker["ports"][0]) == "9092:9092"
    assert "KAFKA_METADATA_STORE_URL" not in broker["environment"]  # SQLite, embedded


def test_the_cluster_profile_is_postgresql_and_three_brokers(
    services: dict[str, dict[str, Any]],
) -> None:
    cluster = {
        name for name, service in services.items() if "cluster" in service.get("profiles", [])
    }
    assert cluster == {"postgres", *CLUSTER_BROKERS}
    postgres = services["postgres"]
    assert _default(postgres["image"]) == "postgres:17"
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    pg = postgres["environment"]
    url = f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"

    environments = [services[name]["environment"] for name in CLUSTER_BROKERS]
    assert [env["KAFKA_NODE_ID"] for env in environments] == ["0", "1", "2"]
    host_ports = []
    for name, env in zip(CLUSTER_BROKERS, environments, strict=True):
        service = services[name]
        host_port, container_port = _default(service["ports"][0]).split(":")
        assert container_port == "9092"  # the image's listener
        # clients on the host reach each broker where it advertises itself
        assert _default(env["KAFKA_ADVERTISED_LISTENERS"]) == f"PLAINTEXT://localhost:{host_port}"
        host_ports.append(host_port)
        assert env["KAFKA_METADATA_STORE_URL"] == url
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert "s3" in service["depends_on"]
        assert service["image"] == services["broker"]["image"]
        assert service["build"] == services["broker"]["build"]
    assert host_ports == ["9093", "9094", "9095"]  # 9092 stays the single broker's

    # one cluster id and one bucket for the three, a cluster id apart from the single broker's
    single = services["broker"]["environment"]
    assert {env["KAFKA_CLUSTER_ID"] for env in environments} == {"automq-compose-cluster"}
    assert single["KAFKA_CLUSTER_ID"] != "automq-compose-cluster"
    for key in ("KAFKA_S3_DATA_BUCKETS", "KAFKA_S3_ACCESS_KEY", "KAFKA_S3_SECRET_KEY"):
        assert {env[key] for env in environments} == {single[key]}

    volumes = [services[name]["volumes"][0].split(":") for name in CLUSTER_BROKERS]
    assert len({source for source, _ in volumes}) == 3  # a WAL each
    assert {target for _, target in volumes} == {"/var/lib/automq"}


def test_the_monitoring_profile_is_prometheus_and_grafana_on_the_brokers_metrics_port(
    services: dict[str, dict[str, Any]],
) -> None:
    monitoring = {
        name for name, service in services.items() if "monitoring" in service.get("profiles", [])
    }
    assert monitoring == {"prometheus", "grafana"}
    # the image serves /metrics on 9464; the single broker publishes it, the cluster's expose it
    assert "KAFKA_METRICS_PORT=9464" in (DOCKER / "Dockerfile").read_text()
    assert _default(services["broker"]["ports"][1]) == "9464:9464"
    for name in CLUSTER_BROKERS:
        assert services[name]["expose"] == ["9464"]

    # Prometheus scrapes each broker service there, with the configuration compose mounts
    prometheus = services["prometheus"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == {f"{name}:9464" for name in ("broker", *CLUSTER_BROKERS)}
    assert _default(prometheus["ports"][0]) == "9090:9090"

    # Grafana: that Prometheus as its data source, the dashboard where its provider looks
    grafana = services["grafana"]
    assert _default(grafana["image"]).startswith("grafana/grafana:")
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    sources = yaml.safe_load(
        (DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"]
    assert [(s["type"], s["url"], s["isDefault"]) for s in sources] == [
        ("prometheus", "http://prometheus:9090", True)
    ]
    providers = yaml.safe_load(
        (DOCKER / "grafana/provisioning/dashboards/automq-py.yml").read_text()
    )["providers"]
    dashboard = mounts["./grafana/automq-py.json"]
    assert dashboard.rsplit("/", 1)[0] == providers[0]["options"]["path"]
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == dashboard


def test_promtool_accepts_the_prometheus_configuration() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", str(DOCKER / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr
