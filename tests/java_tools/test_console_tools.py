"""Apache Kafka 4.4's command-line tools against the real broker process, run as ``bin/*.sh``
runs them (same main classes, Kafka's jars from Maven Central), their output read as a user
reads it: the lines they print, their exit codes, their error messages."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.java_tools.conftest import KafkaTools
from tests.support.broker import BrokerProcess
from tests.support.java import TOOLS, JavaProgram, ToolRun, java_command, run_tool

pytestmark = pytest.mark.integration


def create(tool: KafkaTools, topic: str, partitions: int = 1, *config: str) -> None:
    run = tool(
        "kafka-topics",
        "--create",
        "--topic",
        topic,
        "--partitions",
        str(partitions),
        *config,
    )
    assert run.lines() == [f"Created topic {topic}."]


def produce(broker: BrokerProcess, topic: str, values: list[str], partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for value in values:
        producer.produce(topic, value.encode(), partition=partition)
    assert producer.flush(15) == 0


def table(run: ToolRun, first_column: str) -> list[dict[str, str]]:
    """The rows of a whitespace-aligned table the tools print (kafka-consumer-groups), as dicts
    keyed by its header."""
    lines = run.lines()
    start = next(i for i, line in enumerate(lines) if line.split()[0] == first_column)
    header = lines[start].split()
    rows = []
    for line in lines[start + 1 :]:
        cells = line.split()
        if len(cells) != len(header):
            break
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def eventually(check: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.5)


def test_kafka_topics_creates_lists_describes_alters_and_deletes(
    tool: KafkaTools,
) -> None:
    """kafka-topics: create with configs, --list, --describe (partitions, leader, replicas, ISR,
    the configs given), --alter adds partitions, a replication factor of 3 or a replica
    assignment of this broker gives one replica, and the errors a user meets: an existing
    topic, fewer partitions, an assignment to an unknown broker, an unknown topic."""
    create(
        tool,
        "inventory",
        3,
        "--config",
        "retention.ms=86400000",
        "--config",
        "cleanup.policy=compact",
    )
    assert "inventory" in tool("kafka-topics", "--list").lines()

    describe = tool("kafka-topics", "--describe", "--topic", "inventory").lines()
    head = dict(cell.split(": ", 1) for cell in describe[0].split("\t"))
    assert head["Topic"] == "inventory"
    assert (head["PartitionCount"], head["ReplicationFactor"]) == ("3", "1")
    assert sorted(head["Configs"].split(",")) == ["cleanup.policy=compact", "retention.ms=86400000"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", head["TopicId"])
    rows = [
        dict(cell.split(": ", 1) for cell in line.strip().split("\t")[:5]) for line in describe[1:]
    ]
    assert rows == [
        {"Topic": "inventory", "Partition": str(p), "Leader": "0", "Replicas": "0", "Isr": "0"}
        for p in range(3)
    ]

    tool("kafka-topics", "--alter", "--topic", "inventory", "--partitions", "5")
    describe = tool("kafka-topics", "--describe", "--topic", "inventory").lines()
    assert "PartitionCount: 5" in describe[0] and len(describe) == 6

    again = tool("kafka-topics", "--create", "--topic", "inventory", check=False)
    assert again.returncode == 1
    assert "Topic 'inventory' already exists." in again.stdout
    fewer = tool(
        "kafka-topics", "--alter", "--topic", "inventory", "--partitions", "2", check=False
    )
    assert fewer.returncode == 1 and "InvalidPartitionsException" in fewer.stderr
    # object storage keeps the data durable: a partition has one replica, whatever is asked
    create(tool, "rf3", 2, "--replication-factor", "3")
    tool("kafka-topics", "--create", "--topic", "placed", "--replica-assignment", "0,0")
    for name in ("rf3", "placed"):
        describe = tool("kafka-topics", "--describe", "--topic", name).lines()
        assert "ReplicationFactor: 1" in describe[0]
        assert [line.strip().split("\t")[1:5] for line in describe[1:]] == [
            [f"Partition: {p}", "Leader: 0", "Replicas: 0", "Isr: 0"] for p in range(2)
        ]
    elsewhere = tool(
        "kafka-topics",
        "--create",
        "--topic",
        "elsewhere",
        "--replica-assignment",
        "0,1",
        check=False,
    )
    assert elsewhere.returncode == 1 and "InvalidReplicaAssignmentException" in elsewhere.stderr
    missing = tool("kafka-topics", "--describe", "--topic", "missing", check=False)
    assert missing.returncode == 1
    assert "Topic 'missing' does not exist as expected" in missing.stdout

    tool("kafka-topics", "--delete", "--topic", "inventory")
    eventually(
        lambda: "inventory" not in tool("kafka-topics", "--list").lines(), what="topic deleted"
    )


def test_console_producer_and_consumer_carry_keys_headers_and_timestamps(
    tool: KafkaTools,
) -> None:
    """kafka-console-producer parses keys and headers from its input lines; the console consumer
    prints them back from the beginning, with partition, offset and CreateTime, and stops after
    --max-messages or --timeout-ms, saying how many it processed."""
    create(tool, "orders", 2)
    lines = [f"source:web,n:{i}\torder-{i}|amount={i * 10}" for i in range(6)]
    before = int(time.time() * 1000)
    tool(
        "kafka-console-producer",
        "--topic",
        "orders",
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        "key.separator=|",
        "--reader-property",
        "parse.headers=true",
        "--producer-property",
        "acks=all",
        stdin="\n".join(lines) + "\n",
    )
    after = int(time.time() * 1000)

    run = tool(
        "kafka-console-consumer",
        "--topic",
        "orders",
        "--from-beginning",
        "--max-messages",
        "6",
        *("--formatter-property", "print.key=true"),
        *("--formatter-property", "print.headers=true"),
        *("--formatter-property", "print.partition=true"),
        *("--formatter-property", "print.offset=true"),
        *("--formatter-property", "print.timestamp=true"),
    )
    assert "Processed a total of 6 messages" in run.stderr
    seen: dict[int, list[int]] = {}
    for line in run.lines():
        stamp, partition, offset, headers, key, value = line.split("\t")
        assert stamp.startswith("CreateTime:") and before <= int(stamp[11:]) <= after
        n = int(key.removeprefix("order-"))
        assert value == f"amount={n * 10}"
        assert headers == f"source:web,n:{n}"
        # offsets count from 0 in each partition, in the order the producer sent
        assert int(offset.removeprefix("Offset:")) == len(seen.setdefault(int(partition[10:]), []))
        seen[int(partition[10:])].append(n)
    assert sorted(n for ns in seen.values() for n in ns) == list(range(6))
    assert all(ns == sorted(ns) for ns in seen.values())

    # from a given partition and offset, and a timeout when fewer records exist than asked for
    one = tool(
        "kafka-console-consumer",
        "--topic",
        "orders",
        "--partition",
        "0",
        "--offset",
        "1",
        "--max-messages",
        "1",
    )
    assert one.lines() == [f"amount={seen[0][1] * 10}"]
    short = tool(
        "kafka-console-consumer",
        "--topic",
        "orders",
        "--from-beginning",
        "--max-messages",
        "10",
        "--timeout-ms",
        "3000",
    )
    assert len(short.lines()) == 6 and "Processed a total of 6 messages" in short.stderr


@pytest.fixture
def console_consumer(tool: KafkaTools, tmp_path: Path) -> Iterator[Callable[..., JavaProgram]]:
    """Starts kafka-console-consumer processes that keep running (group members)."""
    started: list[JavaProgram] = []

    def start(*args: str) -> JavaProgram:
        command = java_command(
            TOOLS["kafka-console-consumer"], "--bootstrap-server", tool.broker.bootstrap, *args
        )
        program = JavaProgram(command, tmp_path / f"console-consumer-{len(started)}.log").start()
        started.append(program)
        return program

    yield start
    for program in started:
        program.stop()


def test_consumer_groups_describe_lag_reset_and_delete(
    tool: KafkaTools, console_consumer: Callable[..., JavaProgram]
) -> None:
    """kafka-consumer-groups: a console consumer in a group reads part of a topic; --describe
    shows its offsets, the log end and the lag, its member and the group's state; offsets are
    reset (dry run, then to earliest, to an offset, by a shift) only while the group is
    inactive; --delete-offsets and --delete remove what they name."""
    b = tool.broker
    create(tool, "payments", 1)
    produce(b, "payments", [f"p{i}" for i in range(10)])

    consumer = console_consumer("--topic", "payments", "--group", "billing", "--from-beginning")
    consumer.wait_for(lambda line: line == "p9", timeout=60)
    eventually(
        lambda: (
            table(tool("kafka-consumer-groups", "--describe", "--group", "billing"), "GROUP")[0][
                "CURRENT-OFFSET"
            ]
            == "10"
        ),
        what="the console consumer commits offset 10",
    )
    [row] = table(tool("kafka-consumer-groups", "--describe", "--group", "billing"), "GROUP")
    assert (row["TOPIC"], row["PARTITION"], row["LOG-END-OFFSET"], row["LAG"]) == (
        "payments",
        "0",
        "10",
        "0",
    )
    assert row["CONSUMER-ID"].startswith("console-consumer-") and row["HOST"] == "/127.0.0.1"
    [state] = table(
        tool("kafka-consumer-groups", "--describe", "--group", "billing", "--state"), "GROUP"
    )
    assert (state["STATE"], state["#MEMBERS"], state["ASSIGNMENT-STRATEGY"]) == (
        "Stable",
        "1",
        "range",
    )
    [member] = table(
        tool("kafka-consumer-groups", "--describe", "--group", "billing", "--members"), "GROUP"
    )
    assert member["#PARTITIONS"] == "1"
    assert "billing" in tool("kafka-consumer-groups", "--list").lines()

    busy = tool(
        "kafka-consumer-groups",
        "--group",
        "billing",
        "--reset-offsets",
        "--to-earliest",
        "--topic",
        "payments",
        "--execute",
    )
    assert (
        "Assignments can only be reset if the group 'billing' is inactive, "
        "but the current state is Stable." in busy.stdout
    )
    refused = tool("kafka-consumer-groups", "--delete", "--group", "billing")
    assert "GroupNotEmptyException" in refused.stdout

    consumer.stop()
    produce(b, "payments", [f"p{i}" for i in range(10, 14)])
    eventually(
        lambda: (
            "Empty"
            in tool("kafka-consumer-groups", "--describe", "--group", "billing", "--state").stdout
        ),
        what="the group is empty once its member left",
    )
    [row] = table(tool("kafka-consumer-groups", "--describe", "--group", "billing"), "GROUP")
    assert (row["CURRENT-OFFSET"], row["LOG-END-OFFSET"], row["LAG"], row["CONSUMER-ID"]) == (
        "10",
        "14",
        "4",
        "-",
    )

    def reset(*how: str) -> str:
        run = tool(
            "kafka-consumer-groups",
            "--group",
            "billing",
            "--reset-offsets",
            "--topic",
            "payments",
            *how,
        )
        [result] = table(run, "GROUP")
        return result["NEW-OFFSET"]

    assert reset("--to-earliest", "--dry-run") == "0"
    assert (
        table(tool("kafka-consumer-groups", "--describe", "--group", "billing"), "GROUP")[0][
            "CURRENT-OFFSET"
        ]
        == "10"
    )
    assert reset("--to-earliest", "--execute") == "0"
    assert reset("--to-offset", "7", "--execute") == "7"
    assert reset("--shift-by", "-2", "--execute") == "5"
    assert reset("--to-latest", "--execute") == "14"
    assert reset("--to-datetime", "2020-01-01T00:00:00.000", "--execute") == "0"
    [row] = table(tool("kafka-consumer-groups", "--describe", "--group", "billing"), "GROUP")
    assert (row["CURRENT-OFFSET"], row["LAG"]) == ("0", "14")

    # the next member of the group starts from the reset offset
    again = console_consumer("--topic", "payments", "--group", "billing")
    again.wait_for(lambda line: line == "p13", timeout=60)
    assert again.lines[:14] == [f"p{i}" for i in range(14)]
    again.stop()

    deleted = tool(
        "kafka-consumer-groups", "--delete-offsets", "--group", "billing", "--topic", "payments"
    )
    assert "Request succeeded for deleting offsets from group billing." in deleted.stdout
    gone = tool("kafka-consumer-groups", "--delete", "--group", "billing")
    assert "Deletion of requested consumer groups ('billing') was successful." in gone.stdout
    assert (
        "Consumer group 'billing' does not exist."
        in tool("kafka-consumer-groups", "--describe", "--group", "billing").stdout
    )


def test_kafka_configs_alters_and_describes_topic_and_broker_configs(
    tool: KafkaTools,
) -> None:
    """kafka-configs: a topic's dynamic configs added, shown and deleted; a bad value refused
    naming the property; the broker's configs described with their sources; a broker-wide
    default for a topic config set at run time and reported as a dynamic default."""
    create(tool, "audit", 1)
    topic = ("--entity-type", "topics", "--entity-name", "audit")
    done = tool(
        "kafka-configs",
        *topic,
        "--alter",
        "--add-config",
        "retention.ms=3600000,cleanup.policy=[compact,delete]",
    )
    assert done.lines() == ["Completed updating config for topic audit."]
    described = tool("kafka-configs", *topic, "--describe").lines()
    assert described[0] == "Dynamic configs for topic audit are:"
    assert any(
        line.strip().startswith(
            "retention.ms=3600000 sensitive=false "
            "synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=3600000"
        )
        for line in described
    )
    assert any(line.strip().startswith("cleanup.policy=compact,delete ") for line in described)

    tool("kafka-configs", *topic, "--alter", "--delete-config", "retention.ms")
    described = tool("kafka-configs", *topic, "--describe").lines()
    assert not any("retention.ms=" in line for line in described)

    bad = tool("kafka-configs", *topic, "--alter", "--add-config", "retention.ms=soon", check=False)
    assert bad.returncode != 0
    assert "InvalidConfigurationException" in bad.stderr and "retention.ms" in bad.stderr

    broker = tool(
        "kafka-configs", "--entity-type", "brokers", "--entity-name", "0", "--describe", "--all"
    ).lines()
    assert broker[0] == "All configs for broker 0 are:"
    assert any(line.strip().startswith("log.retention.hours=168 ") for line in broker)

    default = ("--entity-type", "brokers", "--entity-default")
    done = tool("kafka-configs", *default, "--alter", "--add-config", "log.retention.ms=7200000")
    assert done.lines() == ["Completed updating default config for brokers in the cluster."]
    described = tool("kafka-configs", *default, "--describe").lines()
    assert (
        "  log.retention.ms=7200000 sensitive=false "
        "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=7200000}" in described
    )
    tool("kafka-configs", *default, "--alter", "--delete-config", "log.retention.ms")
    assert not any(
        "log.retention.ms" in line for line in tool("kafka-configs", *default, "--describe").lines()
    )


def test_get_offsets_and_delete_records(tool: KafkaTools) -> None:
    """kafka-get-offsets prints topic:partition:offset for the latest, earliest and by-time
    specs; kafka-delete-records moves a partition's low watermark, which the earliest offset
    and a consumer from the beginning then show."""
    b = tool.broker
    create(tool, "clicks", 2)
    start = int(time.time() * 1000)
    produce(b, "clicks", [f"c{i}" for i in range(10)], partition=0)
    produce(b, "clicks", [f"d{i}" for i in range(3)], partition=1)

    assert tool("kafka-get-offsets", "--topic", "clicks").lines() == [
        "clicks:0:10",
        "clicks:1:3",
    ]
    assert tool("kafka-get-offsets", "--topic", "clicks", "--time", "-2").lines() == [
        "clicks:0:0",
        "clicks:1:0",
    ]
    assert tool(
        "kafka-get-offsets", "--topic-partitions", "clicks:1", "--time", str(start)
    ).lines() == ["clicks:1:0"]

    offsets = Path(b.data_dir.parent / "delete-clicks.json")
    offsets.write_text(
        json.dumps({"version": 1, "partitions": [{"topic": "clicks", "partition": 0, "offset": 4}]})
    )
    run = tool("kafka-delete-records", "--offset-json-file", str(offsets))
    assert run.lines() == [
        "Executing records delete operation",
        "Records delete operation completed:",
        "partition: clicks-0\tlow_watermark: 4",
    ]
    assert tool("kafka-get-offsets", "--topic", "clicks", "--time", "-2").lines() == [
        "clicks:0:4",
        "clicks:1:0",
    ]
    read = tool(
        "kafka-console-consumer",
        "--topic",
        "clicks",
        "--partition",
        "0",
        "--offset",
        "earliest",
        "--max-messages",
        "6",
    )
    assert read.lines() == [f"c{i}" for i in range(4, 10)]


def test_kafka_transactions_lists_describes_and_aborts_a_hanging_transaction(
    tool: KafkaTools,
) -> None:
    """kafka-transactions: an open transaction is listed and described (state Ongoing, its
    partition), its producer shows on the partition (describe-producers) with the
    transaction's start offset; `abort` ends it as an operator ends a hanging transaction, after
    which read_committed consumers get past it and the records it wrote stay invisible."""
    b = tool.broker
    create(tool, "ledger", 1)
    producer = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "ledger-writer"})
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("ledger", b"uncommitted", partition=0)
    assert producer.flush(15) == 0

    [listed] = table(tool("kafka-transactions", "list"), "TransactionalId")
    assert (listed["TransactionalId"], listed["TransactionState"]) == ("ledger-writer", "Ongoing")
    [described] = table(
        tool("kafka-transactions", "describe", "--transactional-id", "ledger-writer"),
        "CoordinatorId",
    )
    assert (described["TransactionState"], described["TopicPartitions"]) == ("Ongoing", "ledger-0")
    assert described["ProducerId"] == listed["ProducerId"]
    [producing] = table(
        tool("kafka-transactions", "describe-producers", "--topic", "ledger", "--partition", "0"),
        "ProducerId",
    )
    assert producing["ProducerId"] == listed["ProducerId"]
    assert producing["CurrentTransactionStartOffset"] == "0"

    # the producer goes away without ending its transaction; the operator aborts it
    del producer
    aborted = tool(
        "kafka-transactions",
        "abort",
        "--topic",
        "ledger",
        "--partition",
        "0",
        "--start-offset",
        "0",
    )
    assert aborted.returncode == 0
    after = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    after.produce("ledger", b"committed", partition=0)
    assert after.flush(15) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": b.bootstrap,
            "group.id": "ledger-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition("ledger", 0, 0)])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while not values and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        assert values == [b"committed"]
    finally:
        consumer.close()
    [producing] = table(
        tool("kafka-transactions", "describe-producers", "--topic", "ledger", "--partition", "0"),
        "ProducerId",
    )
    assert producing["CurrentTransactionStartOffset"] == "None"


def test_perf_tools_produce_and_consume_every_record(tool: KafkaTools) -> None:
    """kafka-producer-perf-test sends its records (acks=all) and kafka-consumer-perf-test reads
    them all back; both print their summary lines."""
    b = tool.broker
    create(tool, "perf", 2)
    sent = run_tool(
        "kafka-producer-perf-test",
        *(
            "--topic",
            "perf",
            "--num-records",
            "20000",
            "--record-size",
            "200",
            "--throughput",
            "-1",
        ),
        *("--command-property", f"bootstrap.servers={b.bootstrap}", "acks=all"),
    )
    summary = re.search(
        r"^20000 records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency",
        sent.stdout,
        re.M,
    )
    assert summary is not None, sent.stdout
    assert float(summary.group(1)) > 0

    read = tool(
        "kafka-consumer-perf-test",
        "--topic",
        "perf",
        "--num-records",
        "20000",
        "--timeout",
        "30000",
    )
    header, values = read.lines()[-2:]
    row = dict(
        zip(
            [h.strip() for h in header.split(",")],
            [v.strip() for v in values.split(",")],
            strict=True,
        )
    )
    assert int(row["data.consumed.in.nMsg"]) == 20000
    assert float(row["data.consumed.in.MB"]) == pytest.approx(20000 * 200 / 2**20, rel=1e-3)


def test_leader_election_and_partition_reassignment_on_one_broker(
    tool: KafkaTools, tmp_path: Path
) -> None:
    """kafka-leader-election finds the one replica already leading; kafka-reassign-partitions
    generates, executes and verifies a plan onto the broker already holding the partitions,
    lists no reassignment in progress, and refuses an unknown broker."""
    create(tool, "routes", 2)
    one = tool(
        "kafka-leader-election",
        "--election-type",
        "preferred",
        "--topic",
        "routes",
        "--partition",
        "0",
    )
    assert one.lines() == ["Valid replica already elected for partitions routes-0"]
    unclean = tool(
        "kafka-leader-election",
        "--election-type",
        "unclean",
        "--topic",
        "routes",
        "--partition",
        "1",
    )
    assert unclean.lines() == ["Valid replica already elected for partitions routes-1"]
    # every partition: Kafka leaves out those that need no election, so nothing to report
    assert (
        tool(
            "kafka-leader-election", "--election-type", "preferred", "--all-topic-partitions"
        ).lines()
        == []
    )

    topics = tmp_path / "topics.json"
    topics.write_text(json.dumps({"version": 1, "topics": [{"topic": "routes"}]}))
    generated = tool(
        "kafka-reassign-partitions",
        "--generate",
        "--topics-to-move-json-file",
        str(topics),
        "--broker-list",
        "0",
    ).lines()
    assert (
        generated[0] == "Current partition replica assignment"
        and generated[2] == "Proposed partition reassignment configuration"
    )
    proposed = json.loads(generated[3])
    assert sorted((p["topic"], p["partition"], p["replicas"]) for p in proposed["partitions"]) == [
        ("routes", 0, [0]),
        ("routes", 1, [0]),
    ]
    plan = tmp_path / "plan.json"
    plan.write_text(generated[3])
    # with a replication throttle, set on the broker and the topic first (no replica traffic
    # to throttle over shared storage, but taken as Kafka takes it) and cleared by --verify
    executed = tool(
        "kafka-reassign-partitions",
        "--execute",
        "--reassignment-json-file",
        str(plan),
        "--throttle",
        "50000000",
    ).stdout
    assert "The inter-broker throttle limit was set to 50000000 B/s" in executed
    assert "Successfully started partition reassignments for routes-0,routes-1" in executed
    verified = tool(
        "kafka-reassign-partitions", "--verify", "--reassignment-json-file", str(plan)
    ).lines()
    assert "Reassignment of partition routes-0 is completed." in verified
    assert "Reassignment of partition routes-1 is completed." in verified
    assert tool("kafka-reassign-partitions", "--list").lines() == [
        "No partition reassignments found."
    ]

    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": "routes", "partition": 0, "replicas": [7]}]}
        )
    )
    refused = tool(
        "kafka-reassign-partitions",
        "--execute",
        "--reassignment-json-file",
        str(elsewhere),
        check=False,
    )
    assert refused.returncode == 1 and "Unknown broker id 7" in refused.stdout


def test_features_cluster_id_and_api_versions(tool: KafkaTools) -> None:
    """kafka-features shows the feature levels in force (metadata.version 3.9-IV0, the consumer
    group protocol's group.version 1) and "upgrades" to them; kafka-cluster prints the cluster id;
    kafka-broker-api-versions lists each API with the versions both sides can use."""
    features = {
        line.split()[1]: dict(re.findall(r"(\w+): (\S+)", line))
        for line in tool("kafka-features", "describe").lines()
    }
    assert features["metadata.version"]["FinalizedVersionLevel"] == "3.9-IV0"
    assert features["group.version"]["FinalizedVersionLevel"] == "1"
    # UpdateFeatures: the levels in force are the highest served; a downgrade is refused
    upgraded = tool("kafka-features", "upgrade", "--metadata", "3.9")
    assert "metadata.version was upgraded to 21." in upgraded.stdout
    refused = tool("kafka-features", "downgrade", "--feature", "group.version=0", check=False)
    assert refused.returncode == 1
    assert "Could not downgrade group.version to 0." in refused.stdout
    # a subcommand first, as kafka-cluster's usage has it
    cluster = tool.runner.run(
        "kafka-cluster", "cluster-id", "--bootstrap-server", tool.broker.bootstrap
    ).lines()
    assert cluster == [f"Cluster ID: {tool.broker.overrides['cluster.id']}"]
    versions = tool("kafka-broker-api-versions").stdout
    assert f"{tool.broker.bootstrap} (id: 0 rack: null isFenced: false) -> (" in versions
    assert "Produce(0): 3 to 11 [usable: 11]" in versions
    assert "DescribeTopicPartitions(75): 0 [usable: 0]" in versions


def test_metadata_quorum(tool: KafkaTools) -> None:
    """kafka-metadata-quorum describes the metadata quorum (DescribeQuorum): led by the
    controller, this broker, its one voter, every replica caught up."""
    status = dict(
        line.split(":", 1) for line in tool("kafka-metadata-quorum", "describe", "--status").lines()
    )
    status = {k.strip(): v.strip() for k, v in status.items()}
    assert status["ClusterId"] == tool.broker.overrides["cluster.id"]
    assert status["LeaderId"] == "0"
    assert int(status["LeaderEpoch"]) >= 1 and int(status["HighWatermark"]) >= 1
    assert (status["MaxFollowerLag"], status["CurrentObservers"]) == ("0", "[]")
    assert '"id": 0' in status["CurrentVoters"], status
    assert f"//{tool.broker.bootstrap}" in status["CurrentVoters"], status
    rows = tool("kafka-metadata-quorum", "describe", "--replication").lines()
    assert rows[0].split()[:3] == ["NodeId", "DirectoryId", "LogEndOffset"], rows
    assert len(rows) == 2 and rows[1].split()[0] == "0" and rows[1].split()[-1] == "Leader"


def test_a_console_consumer_in_a_kip_848_group(
    tool: KafkaTools, console_consumer: Callable[..., JavaProgram]
) -> None:
    """The Java consumer with group.protocol=consumer (KIP-848) joins through the broker's
    group coordinator: kafka-consumer-groups shows the group with the server-side assignor and
    its member, kafka-groups lists it as a Consumer group, and its committed offsets show once
    the member has left."""
    create(tool, "shipments", 2)
    produce(tool.broker, "shipments", [f"s{i}" for i in range(4)], partition=0)
    produce(tool.broker, "shipments", [f"t{i}" for i in range(4)], partition=1)
    consumer = console_consumer(
        *("--topic", "shipments", "--group", "dispatch", "--from-beginning"),
        *("--command-property", "group.protocol=consumer"),
    )
    eventually(lambda: {"s3", "t3"} <= set(consumer.lines), 60, "every record consumed")
    eventually(
        lambda: (
            "Stable"
            in tool("kafka-consumer-groups", "--describe", "--group", "dispatch", "--state").stdout
        ),
        what="the group is stable",
    )
    [state] = table(
        tool("kafka-consumer-groups", "--describe", "--group", "dispatch", "--state"), "GROUP"
    )
    assert (state["ASSIGNMENT-STRATEGY"], state["STATE"], state["#MEMBERS"]) == (
        "uniform",
        "Stable",
        "1",
    )
    [member] = table(
        tool("kafka-consumer-groups", "--describe", "--group", "dispatch", "--members"), "GROUP"
    )
    assert member["#PARTITIONS"] == "2" and member["CLIENT-ID"].startswith("console-consumer")
    listed = table(tool("kafka-groups", "--list"), "GROUP")
    assert {"GROUP": "dispatch", "TYPE": "Consumer", "PROTOCOL": "consumer"} in listed

    consumer.stop()
    eventually(
        lambda: (
            "Empty"
            in tool("kafka-consumer-groups", "--describe", "--group", "dispatch", "--state").stdout
        ),
        what="the group is empty once its member left",
    )
    rows = table(tool("kafka-consumer-groups", "--describe", "--group", "dispatch"), "GROUP")
    assert sorted((r["PARTITION"], r["CURRENT-OFFSET"], r["LAG"]) for r in rows) == [
        ("0", "4", "0"),
        ("1", "4", "0"),
    ]


def _owned(consumer: JavaProgram, topic: str) -> set[int]:
    """The partitions a VerifiableConsumer holds now, from its rebalance events (incremental
    for the consumer protocol and cooperative assignors, whole for eager ones)."""
    owned: set[int] = set()
    for line in list(consumer.lines):
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event.get("name") not in ("partitions_assigned", "partitions_revoked"):
            continue
        partitions = {int(p["partition"]) for p in event["partitions"] if p["topic"] == topic}
        if event["name"] == "partitions_assigned":
            owned |= partitions
        else:
            owned -= partitions
    return owned


def _values(consumer: JavaProgram) -> set[str]:
    return {
        str(json.loads(line)["value"])
        for line in list(consumer.lines)
        if line.startswith("{") and '"name":"record_data"' in line
    }


def test_java_consumers_move_their_group_to_the_consumer_protocol_and_back(
    tool: KafkaTools, tmp_path: Path
) -> None:
    """A rolling switch of ``group.protocol`` as Kafka documents it (KIP-848's online
    migration): two Java consumers of the classic protocol share a topic; a third with
    ``group.protocol=consumer`` joins, the group becomes a consumer-protocol group and the
    three share the partitions; it leaves and the classic pair takes everything back. Kafka's
    VerifiableProducer writes throughout, and every acknowledged record is consumed."""
    topic, group = "rolling", "rolling-group"
    create(tool, topic, 6)
    config = tmp_path / "classic.properties"
    config.write_text("session.timeout.ms=6000\nheartbeat.interval.ms=500\n")

    def consumer(name: str, protocol: str) -> JavaProgram:
        args = ["--bootstrap-server", tool.broker.bootstrap, "--topic", topic]
        args += ["--group-id", group, "--group-protocol", protocol, "--verbose"]
        args += ["--reset-policy", "earliest"]
        if protocol == "classic":
            args += ["--consumer.config", str(config)]
        command = java_command("org.apache.kafka.tools.VerifiableConsumer", *args)
        return JavaProgram(command, tmp_path / f"{name}.log").start()

    producer = JavaProgram(
        java_command(
            "org.apache.kafka.tools.VerifiableProducer",
            *("--bootstrap-server", tool.broker.bootstrap, "--topic", topic),
            *("--throughput", "200", "--acks", "-1"),
        ),
        tmp_path / "producer.log",
    ).start()
    classic = [consumer(f"classic-{i}", "classic") for i in range(2)]
    upgrader: JavaProgram | None = None
    everything = set(range(6))

    def split(members: list[JavaProgram], sizes: list[int]) -> Callable[[], bool]:
        def check() -> bool:
            for m in members + classic:
                assert m.alive or m not in members, f"a consumer exited:\n{m.log_tail()}"
            owned = [_owned(m, topic) for m in members]
            disjoint = sum(len(o) for o in owned) == len(everything)
            return (
                disjoint and set().union(*owned) == everything and sorted(map(len, owned)) == sizes
            )

        return check

    try:
        eventually(split(classic, [3, 3]), 60, "the classic pair shares the topic")
        listed = table(tool("kafka-groups", "--list"), "GROUP")
        assert {"GROUP": group, "TYPE": "Classic", "PROTOCOL": "consumer"} in listed
        upgrader = consumer("upgrader", "consumer")
        eventually(split([*classic, upgrader], [2, 2, 2]), 90, "the three share the topic")
        [state] = table(
            tool("kafka-consumer-groups", "--describe", "--group", group, "--state"), "GROUP"
        )
        # a consumer-protocol group (the server-side assignor), its classic members included
        assert (state["ASSIGNMENT-STRATEGY"], state["#MEMBERS"]) == ("uniform", "3")
        listed = table(tool("kafka-groups", "--list"), "GROUP")
        assert {"GROUP": group, "TYPE": "Consumer", "PROTOCOL": "consumer"} in listed
        # it reads from its partitions before it leaves (fetched from the committed offsets)
        eventually(lambda: bool(_values(upgrader)), 60, "the consumer-protocol member consumes")
        assert upgrader.stop() in (0, 143)
        eventually(split(classic, [3, 3]), 90, "the classic pair takes everything back")
        [state] = table(
            tool("kafka-consumer-groups", "--describe", "--group", group, "--state"), "GROUP"
        )
        assert (state["ASSIGNMENT-STRATEGY"], state["STATE"], state["#MEMBERS"]) == (
            "range",
            "Stable",
            "2",
        )
        assert producer.stop(60) in (0, 143)
        acked = {
            str(json.loads(line)["value"])
            for line in list(producer.lines)
            if line.startswith("{") and '"name":"producer_send_success"' in line
        }
        assert len(acked) >= 200
        consumed = [*classic, upgrader]
        eventually(
            lambda: acked <= set().union(*(_values(m) for m in consumed)),
            60,
            "every acknowledged record consumed",
        )
        assert _values(upgrader), "the consumer-protocol member consumed nothing"
    finally:
        producer.stop()
        for m in [*classic, *([upgrader] if upgrader is not None else [])]:
            m.stop()


def test_kafka_configs_for_a_consumer_group(tool: KafkaTools) -> None:
    """kafka-configs --entity-type groups: a consumer group's session timeout and heartbeat
    interval shown with the broker defaults they come from, set, refused out of bounds with
    Kafka's message, and deleted back to the default."""
    group = ("--entity-type", "groups", "--entity-name", "checkout")
    described = tool("kafka-configs", *group, "--describe", "--all").lines()
    assert described == [
        "All configs for group checkout are:",
        "  consumer.heartbeat.interval.ms=5000 sensitive=false "
        "synonyms={DEFAULT_CONFIG:group.consumer.heartbeat.interval.ms=5000}",
        "  consumer.session.timeout.ms=45000 sensitive=false "
        "synonyms={DEFAULT_CONFIG:group.consumer.session.timeout.ms=45000}",
    ]
    done = tool(
        "kafka-configs", *group, "--alter", "--add-config", "consumer.session.timeout.ms=50000"
    )
    assert done.lines() == ["Completed updating config for group checkout."]
    assert tool("kafka-configs", *group, "--describe").lines() == [
        "Dynamic configs for group checkout are:",
        "  consumer.session.timeout.ms=50000 sensitive=false "
        "synonyms={DYNAMIC_GROUP_CONFIG:consumer.session.timeout.ms=50000, "
        "DEFAULT_CONFIG:group.consumer.session.timeout.ms=45000}",
    ]
    bad = tool(
        "kafka-configs",
        *group,
        "--alter",
        "--add-config",
        "consumer.session.timeout.ms=5",
        check=False,
    )
    assert bad.returncode != 0
    assert (
        "consumer.session.timeout.ms must be in the range 45000 to 60000 inclusive." in bad.stderr
    )
    tool("kafka-configs", *group, "--alter", "--delete-config", "consumer.session.timeout.ms")
    assert tool("kafka-configs", *group, "--describe").lines() == [
        "Dynamic configs for group checkout are:"
    ]
