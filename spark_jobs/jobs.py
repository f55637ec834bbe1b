"""The job drivers behind ``automq-py compact|retention|gc`` and the broker's own maintenance.

Each driver reads metadata from the broker's controller at ``bootstrap`` (over the Kafka
protocol, with AutoMQ's extension APIs), plans units with the pure planners in ``storage/``,
maps them over ``runner`` (Spark executors, or threads of this process) and commits the
results through the broker: the jobs never write the metadata database themselves. A commit
that lost a race with the live broker (a source compacted, trimmed or destroyed meanwhile, a
node restarted) is refused by the controller, and the objects the job wrote are deleted.

Each prints its plan to ``out`` and, with ``dry_run``, stops there, changing nothing. Each
returns counters that the command prints as its summary line.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Sequence
from typing import TextIO

from spark_jobs.controller_client import ControllerClient, ControllerError
from spark_jobs.key_compaction import KeyCompactionUnit, clean_partition
from spark_jobs.runner import Runner, run_units
from storage.compaction.analyzer import SourceObject, plan_compaction, select_sources
from storage.compaction.cleanable import plan_cleaning
from storage.compaction.gc import KEY_PREFIXES, destroyable, find_orphans
from storage.compaction.stream_objects import plan_stream_object_compaction
from storage.compaction.units import (
    DeleteUnit,
    IndexReadUnit,
    ListUnit,
    SOCompactionUnit,
    SSOCompactionUnit,
    StoreSpec,
    compact_stream_objects,
    compact_stream_set_objects,
    delete_keys,
    list_keys,
    read_indexes,
)
from storage.config import S3StreamConfig
from storage.metadata.image import MetadataImage
from storage.metadata.model import INIT_EPOCH, MetadataError, NodeMetadata, ObjectState
from storage.operator.base import DELETE_BATCH
from storage.retention import PartitionLog, RetentionAction, plan_retention

log = logging.getLogger("automq.jobs")

COMPACTION_KINDS = ("sso", "so", "key", "all")
MINUTE_MS = 60_000
INDEXES_PER_UNIT = 64  # SSO indexes one unit reads (one small GET each)
PARTITIONS_PER_UNIT = 1000  # partitions one retention planning unit decides
PREFIXES_PER_UNIT = 4  # key prefixes one listing unit walks (16 in all)
# Tests only: with ``AUTOMQ_JOB_FAULT=pause-before-commit`` a compaction job holds forever
# between writing its objects and committing them, so that a test can kill it there.
FAULT_ENV = "AUTOMQ_JOB_FAULT"
PAUSE_BEFORE_COMMIT = "pause-before-commit"


async def run_compaction(
    storage_config: S3StreamConfig,
    bootstrap: str,
    runner: Runner,
    *,
    kind: str,
    dry_run: bool,
    out: TextIO,
) -> dict[str, int]:
    """Compact Stream Set Objects (``sso``), Stream Objects (``so``), compacted topics' keys
    (``key``), or all three (``all``)."""
    if kind not in COMPACTION_KINDS:
        raise ValueError(f"kind must be one of {', '.join(COMPACTION_KINDS)}, not {kind!r}")
    spec = StoreSpec.from_config(storage_config)
    counters: Counter[str] = Counter()
    async with await ControllerClient.connect(bootstrap) as client:
        if kind in ("sso", "all"):
            image, now = await client.describe_s3_metadata()
            for node in sorted(image.nodes.values(), key=lambda n: n.node_id):
                await _compact_node(
                    client, runner, spec, storage_config, image, node, now, dry_run, out, counters
                )
        if kind in ("so", "all"):
            image, _ = await client.describe_s3_metadata()
            await _compact_stream_objects(
                client, runner, spec, storage_config, image, dry_run, out, counters
            )
        if kind in ("key", "all"):
            await _compact_keys(client, bootstrap, runner, dry_run, out, counters)
    return dict(counters)


async def _compact_keys(
    client: ControllerClient,
    bootstrap: str,
    runner: Runner,
    dry_run: bool,
    out: TextIO,
    counters: Counter[str],
) -> None:
    """Key compaction of compacted topics (Kafka's log cleaner): each partition whose dirty
    share reached ``min.cleanable.dirty.ratio`` is read through the broker (read_committed
    Fetch: raw batches and aborted transactions), cleaned by a unit (the last record per key,
    tombstones until ``delete.retention.ms``, aborted data and spent markers dropped), and its
    output replaces the range's segments with one ``.cleaned`` segment (CommitCleanedSegment).
    A partition whose segments changed meanwhile refuses the commit; the next run retries."""
    logs, now = await client.describe_log_segments(cleanup_policy="compact")
    planned = [u for log_ in logs if (u := plan_cleaning(log_, now)) is not None]
    counters["partitions_checked"] += len(logs)
    for u in planned:
        overdue = ", max.compaction.lag.ms passed" if u.overdue else ""
        print(
            f"{u.topic}-{u.partition}: clean [{u.base_offset}, {u.end_offset}) "
            f"({u.segments} segments, {u.total_bytes} bytes, dirty {u.dirty_ratio:.0%}{overdue})",
            file=out,
        )
    if dry_run or not planned:
        return
    units = [KeyCompactionUnit(bootstrap, u, now) for u in planned]
    for result in await run_units(runner, clean_partition, units, desc="key compaction"):
        u = result.unit.clean
        try:
            replaced = await client.commit_cleaned_segment(
                u.topic, u.partition, u.base_offset, u.end_offset, result.batches, result.aborted
            )
        except ControllerError as e:
            print(f"{u.topic}-{u.partition}: refused: {e}", file=out)
            counters["partitions_refused"] += 1
            continue
        counters["partitions_cleaned"] += 1
        counters["segments_replaced"] += replaced
        counters["records_in"] += result.records_in
        counters["records_kept"] += result.records_kept
        counters["bytes_in"] += result.bytes_in
        counters["bytes_out"] += sum(len(data) for _, data in result.batches)


async def _compact_node(
    client: ControllerClient,
    runner: Runner,
    spec: StoreSpec,
    config: S3StreamConfig,
    image: MetadataImage,
    node: NodeMetadata,
    now: int,
    dry_run: bool,
    out: TextIO,
    counters: Counter[str],
) -> None:
    committed = [
        sso
        for sso in node.stream_set_objects
        if (o := image.objects.get(sso.object_id)) is not None and o.state is ObjectState.COMMITTED
    ]
    if not committed:
        return
    metas = [
        SourceObject(s.object_id, s.object_size, s.order_id, s.data_time_ms, ()) for s in committed
    ]
    chosen, _ = select_sources(metas, config.sso_compaction_max_num)
    units = [
        IndexReadUnit(
            spec, tuple((s.object_id, s.object_size) for s in chosen[i : i + INDEXES_PER_UNIT])
        )
        for i in range(0, len(chosen), INDEXES_PER_UNIT)
    ]
    indexes: dict[int, tuple] = {}
    for part in await run_units(
        runner, read_indexes, units, desc=f"node {node.node_id}: read SSO indexes"
    ):
        indexes.update(part)
    sources = [
        SourceObject(s.object_id, s.object_size, s.order_id, s.data_time_ms, indexes[s.object_id])
        for s in chosen
    ]
    plan = plan_compaction(
        sources,
        {sid: s.start_offset for sid, s in image.streams.items()},
        split_size=config.sso_compaction_split_size,
        cache_size=config.sso_compaction_cache_size,
        force_split_before_ms=now - int(config.sso_compaction_force_split_minutes * MINUTE_MS),
    )
    if plan is None:
        print(
            f"node {node.node_id}: {len(committed)} stream set objects, nothing to compact",
            file=out,
        )
        return
    print(
        f"node {node.node_id}: compact {len(plan.compacted_object_ids)} of {len(committed)} stream "
        f"set objects ({plan.read_bytes} bytes) into "
        f"{1 if plan.has_stream_set_object else 0} stream set object + "
        f"{plan.stream_object_count} stream objects in {len(plan.iterations)} iterations of at "
        f"most {config.sso_compaction_cache_size} bytes; {plan.get_count} GETs for "
        f"{plan.block_count} blocks; {plan.dropped_bytes} bytes of trimmed or deleted streams "
        f"dropped",
        file=out,
    )
    if dry_run:
        return
    first = await client.prepare_objects(plan.object_count, config.object_prepare_ttl_ms)
    epochs = {sid: s.epoch for sid, s in image.streams.items()}
    [result] = await run_units(
        runner,
        compact_stream_set_objects,
        [SSOCompactionUnit(spec, plan, first, epochs)],
        desc=f"node {node.node_id}: compact SSOs",
    )
    await _fault_point(PAUSE_BEFORE_COMMIT, out)
    try:
        await client.commit_stream_set_object(
            node.node_id,
            node.epoch,
            result.object_id,
            min(s.order_id for s in sources),
            result.object_size,
            result.ranges,
            result.stream_objects,
            plan.compacted_object_ids,
        )
    except MetadataError as e:
        print(f"node {node.node_id}: commit refused, {e}; removing the new objects", file=out)
        await _delete(runner, spec, result.keys)
        counters["commits_refused"] += 1
        return
    counters["sso_compacted"] += len(plan.compacted_object_ids)
    counters["sso_written"] += 1 if result.object_id >= 0 else 0
    counters["so_written"] += len(result.stream_objects)
    counters["bytes_read"] += result.read_bytes
    counters["bytes_written"] += result.written_bytes
    counters["gets"] += result.requests.get("get", 0)
    counters["puts"] += sum(result.requests.get(k, 0) for k in ("put", "part"))


async def _compact_stream_objects(
    client: ControllerClient,
    runner: Runner,
    spec: StoreSpec,
    config: S3StreamConfig,
    image: MetadataImage,
    dry_run: bool,
    out: TextIO,
    counters: Counter[str],
) -> None:
    groups = plan_stream_object_compaction(image.streams.values(), config.so_compaction_max_size)
    sources = sum(len(g.sources) for g in groups)
    print(f"stream objects: merge {sources} into {len(groups)}", file=out)
    if dry_run or not groups:
        return
    first = await client.prepare_objects(len(groups), config.object_prepare_ttl_ms)
    units = [SOCompactionUnit(spec, g, first + i) for i, g in enumerate(groups)]
    results = await run_units(runner, compact_stream_objects, units, desc="merge stream objects")
    await _fault_point(PAUSE_BEFORE_COMMIT, out)
    by_id = {u.object_id: u.group for u in units}
    refused: list[str] = []
    for result in results:
        group = by_id[result.object_id]
        try:
            await client.commit_stream_object(
                result.object_id,
                group.stream_id,
                INIT_EPOCH,  # the sources are checked; the owner may reopen meanwhile
                group.start_offset,
                group.end_offset,
                result.object_size,
                [so.object_id for so in group.sources],
            )
        except MetadataError as e:
            log.info("stream %d: merge refused, %s", group.stream_id, e)
            refused += result.keys
            counters["commits_refused"] += 1
            continue
        counters["so_compacted"] += len(group.sources)
        counters["so_written"] += 1
        counters["so_copied"] += 1 if result.copied else 0
    if refused:
        await _delete(runner, spec, refused)


async def _fault_point(name: str, out: TextIO) -> None:
    """Hold here forever when the tests' fault variable names this point."""
    if os.environ.get(FAULT_ENV) == name:
        print(f"fault point {name}: holding", file=out, flush=True)
        await asyncio.Event().wait()


async def run_retention(
    storage_config: S3StreamConfig,
    bootstrap: str,
    runner: Runner,
    *,
    dry_run: bool,
    out: TextIO,
) -> dict[str, int]:
    """Apply ``retention.ms`` / ``retention.bytes``: the job decides each partition's new log
    start offset and the partition's owner applies it (DeleteRecords: whole segments leave
    ElasticLogMeta, streams are trimmed, objects left with nothing are marked destroyed)."""
    counters: Counter[str] = Counter()
    async with await ControllerClient.connect(bootstrap) as client:
        logs, now = await client.describe_log_segments(cleanup_policy="delete")
        chunks = [
            (tuple(logs[i : i + PARTITIONS_PER_UNIT]), now)
            for i in range(0, len(logs), PARTITIONS_PER_UNIT)
        ]
        actions = [
            a
            for part in await run_units(runner, plan_retention_chunk, chunks, desc="retention")
            for a in part
        ]
        for a in actions:
            print(
                f"{a.topic}-{a.partition}: log start -> {a.new_start_offset} "
                f"({a.segments} segments, {a.bytes} bytes, {a.reason})",
                file=out,
            )
        counters["partitions_checked"] = len(logs)
        if dry_run or not actions:
            return dict(counters)
        answers = await client.delete_records(
            {(a.topic, a.partition): a.new_start_offset for a in actions}
        )
        for a in actions:
            error, _ = answers.get((a.topic, a.partition), (-1, -1))
            if error:
                print(f"{a.topic}-{a.partition}: refused with error {error}", file=out)
                counters["partitions_refused"] += 1
            else:
                counters["partitions_trimmed"] += 1
                counters["segments_deleted"] += a.segments
                counters["bytes_deleted"] += a.bytes
    return dict(counters)


def plan_retention_chunk(chunk: tuple[Sequence[PartitionLog], int]) -> list[RetentionAction]:
    """A retention unit: the actions for some partitions at the controller's time."""
    logs, now = chunk
    return [a for log in logs if (a := plan_retention(log, now)) is not None]


async def run_gc(
    storage_config: S3StreamConfig,
    bootstrap: str,
    runner: Runner,
    *,
    dry_run: bool,
    out: TextIO,
) -> dict[str, int]:
    """Delete objects marked destroyed longer than ``s3.object.delete.retention.minutes``
    (PREPARED ones past their deadline are marked first) and orphans older than
    ``s3.object.gc.orphan.min.age.minutes``; print what goes."""
    spec = StoreSpec.from_config(storage_config)
    counters: Counter[str] = Counter()
    # list first: an object listed now is named by any later metadata unless it is an orphan
    units = [
        ListUnit(spec, KEY_PREFIXES[i : i + PREFIXES_PER_UNIT])
        for i in range(0, len(KEY_PREFIXES), PREFIXES_PER_UNIT)
    ]
    listings = await run_units(runner, list_keys, units, desc="gc: list bucket")
    listing = [info for part in listings for info in part]
    async with await ControllerClient.connect(bootstrap) as client:
        if dry_run:
            image, now = await client.describe_s3_metadata()
            expired = [
                o.object_id
                for o in image.objects.values()
                if o.state is ObjectState.PREPARED and o.expires_ms <= now
            ]
        else:
            expired = await client.expire_prepared_objects()
            image, now = await client.describe_s3_metadata()
        retention_ms = int(storage_config.object_delete_retention_minutes * MINUTE_MS)
        doomed = destroyable(image, now, retention_ms)
        orphans = find_orphans(
            listing,
            image,
            spec.namespace,
            now,
            int(storage_config.gc_orphan_min_age_minutes * MINUTE_MS),
        )
        print(
            f"gc: {len(listing)} objects in the bucket; {len(expired)} prepared objects expired; "
            f"{len(doomed)} destroyed objects to delete ({sum(o.object_size for o in doomed)} "
            f"bytes); {len(orphans)} orphans ({sum(o.size for o in orphans)} bytes)",
            file=out,
        )
        for o in doomed:
            print(f"  delete {spec.key(o.object_id)} ({o.object_size} bytes, destroyed)", file=out)
        for orphan in orphans:
            print(
                f"  delete {orphan.key} ({orphan.size} bytes, orphan, "
                f"{orphan.age_ms // 1000}s old)",
                file=out,
            )
        counters["objects_listed"] = len(listing)
        counters["prepared_expired"] = len(expired)
        if dry_run:
            return dict(counters)
        await _delete(
            runner, spec, [spec.key(o.object_id) for o in doomed] + [o.key for o in orphans]
        )
        if doomed:
            await client.destroy_objects([o.object_id for o in doomed])
        counters["objects_deleted"] = len(doomed)
        counters["orphans_deleted"] = len(orphans)
        counters["bytes_deleted"] = sum(o.object_size for o in doomed) + sum(
            o.size for o in orphans
        )
    return dict(counters)


async def _delete(runner: Runner, spec: StoreSpec, keys: Sequence[str]) -> None:
    if not keys:
        return
    units = [
        DeleteUnit(spec, tuple(keys[i : i + DELETE_BATCH]))
        for i in range(0, len(keys), DELETE_BATCH)
    ]
    await run_units(runner, delete_keys, units, desc="delete objects")
