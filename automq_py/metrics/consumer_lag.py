"""Consumer lag as kafka-exporter computes it: per group and partition, the partition's high
watermark minus the group's committed offset (never below zero). Only partitions whose high
watermark this broker knows (it leads them, and they are open) have a lag."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from automq_py.coordinator.records import OffsetValue

# (group, topic, [(partition, committed offset, lag)]) per group and topic
GroupTopicLag = tuple[str, str, list[tuple[int, int, int]]]


def group_lags(
    offsets: Mapping[str, Mapping[tuple[str, int], OffsetValue]],
    high_watermarks: Mapping[tuple[str, int], int],
) -> Iterator[GroupTopicLag]:
    """Each group's lag per topic, in group then topic then partition order."""
    for group_id in sorted(offsets):
        by_topic: dict[str, list[tuple[int, int, int]]] = {}
        for (topic, partition), committed in list(offsets[group_id].items()):
            end = high_watermarks.get((topic, partition))
            if end is None or committed.offset < 0:
                continue
            lag = max(end - committed.offset, 0)
            by_topic.setdefault(topic, []).append((partition, committed.offset, lag))
        for topic in sorted(by_topic):
            yield group_id, topic, sorted(by_topic[topic])
