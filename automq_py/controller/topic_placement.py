"""Leaders of new partitions, decided inside the metadata change that creates them.

Any broker may create a topic (CreateTopics, auto-creation, a coordinator's internal topic): the
change that adds the topic also sets its partitions' leaders, placed by
:func:`automq_py.controller.placement.place_new_partitions` over the live brokers. The change is
checked against the latest image, so two brokers creating topics at once both place against the
state the other left.
"""

from __future__ import annotations

from automq_py.controller import membership
from automq_py.controller.placement import place_new_partitions
from automq_py.metadata_cache import ClusterMetadataCache
from storage.metadata.image import MetadataImage
from storage.metadata.records import Record


class ClusterTopicPlacement:
    """:class:`automq_py.topics.LeaderPlacement` for a cluster."""

    def __init__(self, cache: ClusterMetadataCache) -> None:
        # the cache follows the image the change is checked against: the manager applies
        # records and tells its listeners before it plans the next change
        self._cache = cache

    def new_partitions(
        self, image: MetadataImage, topic: str, count: int, first_index: int
    ) -> list[Record]:
        brokers = list(membership.brokers(image).values())
        current = self._cache.all_leaders()
        leaders = place_new_partitions(brokers, current, topic, count, first_index)
        if first_index == 0:
            return membership.set_new_topic_leaders(topic, leaders)
        return membership.add_partition_leaders(image, topic, leaders)

    def dropped(self, image: MetadataImage, topic: str) -> list[Record]:
        return membership.drop_topic_leaders(image, topic)
