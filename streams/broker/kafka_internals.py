"""Everything outside the worker does with aiokafka's insides, in one module.

aiokafka's consumer and admin client answer "which topics exist, with how many partitions" from
a cached view of the cluster, refreshed in the background: a topic made a moment ago may be
missing from it, and a client that waits for a topic, or checks the partition counts before it
starts, must ask the broker afresh. aiokafka has no public call for that, so
:func:`fresh_metadata` reads the private client both hold (``_client``, an
:class:`aiokafka.client.AIOKafkaClient`) and asks it. The clients, the broker tools and the
benchmarks call :func:`fresh_metadata`; the worker's own uses of library internals are in
:mod:`streams.worker.faust_internals`.

What this relies on is listed in :data:`UPSTREAM` (see :mod:`streams.broker.upstream`):
``tests/test_faust_boundary.py`` fails when its source differs from the one reviewed for the
pinned aiokafka, and when any module but these two touches a library's private name.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.cluster import ClusterMetadata

from .upstream import Upstream

__all__ = ["UPSTREAM", "fresh_metadata"]

UPSTREAM: tuple[Upstream, ...] = (
    Upstream(
        "aiokafka",
        "aiokafka.consumer.consumer",
        "AIOKafkaConsumer.__init__",
        "relied on",
        "fresh_metadata",
    ),
    Upstream(
        "aiokafka",
        "aiokafka.admin.client",
        "AIOKafkaAdminClient.__init__",
        "relied on",
        "fresh_metadata",
    ),
    Upstream(
        "aiokafka",
        "aiokafka.client",
        "AIOKafkaClient.fetch_all_metadata",
        "relied on",
        "fresh_metadata",
    ),
)
"""The consumer's and the admin client's ``_client`` (made in their ``__init__``) and its
``fetch_all_metadata``: one Metadata request for every topic, answered by the broker now."""


async def fresh_metadata(client: AIOKafkaConsumer | AIOKafkaAdminClient) -> ClusterMetadata:
    """The cluster as the broker sees it now (every topic and its partitions), not the
    ``client``'s cached view, which may not have a topic made a moment ago yet.

    Parameters
    ----------
    client : AIOKafkaConsumer or AIOKafkaAdminClient
        A started client: its connection to the cluster asks.

    Returns
    -------
    ClusterMetadata
        Fresh: ``partitions_for_topic`` and ``topics`` answer from the broker's reply.

    Raises
    ------
    aiokafka.errors.KafkaError
        No broker answered.
    """
    cluster: ClusterMetadata = await client._client.fetch_all_metadata()
    return cluster
