"""A small asyncio client for sellers and buyers (used by the CLI, the demo and the tests).

It speaks only the public wire format (:mod:`streams.events`) over aiokafka, so it doubles as a
reference for clients in other languages. Reads never use consumer groups: a buyer's topic is read
from the beginning and answers are matched by request id, which also works on the embedded broker
whose "latest offset" answer is unreliable.

Purchases are **retried by resending the same purchase id** when no outcome arrives in time: the
market treats the id as an idempotency key, so a resend can never charge twice or draw new noise,
and it repairs the rare case of a worker skipping an event during a consumer-group rebalance.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from market.envelope import public_key_b64

from ..broker.admin import ensure_topics
from ..broker.auth import env_auth
from ..wire.events import (
    BUYER_EVENT,
    CatalogEntry,
    PurchaseFulfilled,
    PurchaseRequest,
    QuoteAnswer,
    QuoteRequest,
    Rejection,
    StreamRegistration,
    ValueEvent,
    ValueReleased,
)
from ..wire.sealing import open_event
from ..wire.topics import Topics

__all__ = ["MarketClient", "TopicReader"]

BuyerEvent = PurchaseFulfilled | ValueReleased | QuoteAnswer | Rejection


class TopicReader:
    """Reads every partition of one or more topics from the beginning, without a group."""

    def __init__(
        self,
        bootstrap: str,
        topic: str | Sequence[str],
        *,
        fetch_max_wait_ms: int = 20,
        **auth: Any,
    ) -> None:
        self.topics = [topic] if isinstance(topic, str) else list(topic)
        self._consumer = AIOKafkaConsumer(
            **auth,
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=fetch_max_wait_ms,
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )

    async def start(self) -> None:
        try:
            await self._consumer.start()
        except BaseException:
            await self._consumer.stop()
            raise
        tps: list[TopicPartition] = []
        for topic in self.topics:
            parts: set[int] | None = None
            for _ in range(50):
                await self._consumer.topics()
                parts = self._consumer.partitions_for_topic(topic)
                if parts:
                    break
                await asyncio.sleep(0.1)
            if not parts:
                raise RuntimeError(f"topic {topic} has no partitions")
            tps += [TopicPartition(topic, p) for p in sorted(parts)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)

    async def stop(self) -> None:
        await self._consumer.stop()

    async def poll(self, timeout: float = 0.5) -> list[tuple[bytes | None, bytes]]:
        batch = await self._consumer.getmany(timeout_ms=int(timeout * 1000))
        return [(r.key, r.value) for recs in batch.values() for r in recs if r.value is not None]


class MarketClient:
    """Producer plus on-demand topic readers against one broker."""

    def __init__(
        self, bootstrap: str, topics: Topics | None = None, *, auth: dict[str, Any] | None = None
    ) -> None:
        """``auth``: aiokafka SASL keyword arguments (see :func:`streams.config.kafka_auth`);
        defaults to ``EMARKET_KAFKA_USER``/``EMARKET_KAFKA_PASSWORD`` if set."""
        self.bootstrap = bootstrap
        self.topics = topics or Topics()
        self.auth = auth if auth is not None else env_auth()
        self._published: dict[tuple[str, str], int] = {}
        self._requested: dict[tuple[str, str], int] = {}
        self._producer = AIOKafkaProducer(
            **self.auth,
            bootstrap_servers=bootstrap,
            linger_ms=2,
            max_request_size=16 * 1024 * 1024,
            acks="all",
        )

    async def __aenter__(self) -> MarketClient:
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()  # release its connections and warnings
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._producer.stop()

    async def send(self, topic: str, key: str, payload: bytes) -> None:
        await self._producer.send_and_wait(topic, payload, key=key.encode())

    # -- sellers ---------------------------------------------------------------------------
    async def register(
        self, registration: StreamRegistration, *, timeout: float = 30.0
    ) -> CatalogEntry | Rejection:
        """Register a stream and wait for the catalog entry (or the rejection)."""
        catalog = TopicReader(self.bootstrap, self.topics.catalog, **self.auth)
        rejections = TopicReader(self.bootstrap, self.topics.rejections, **self.auth)
        await catalog.start()
        await rejections.start()
        try:
            await self.send(
                self.topics.registrations,
                registration.stream_id,
                registration.model_dump_json().encode(),
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for _, raw in await catalog.poll(0.2):
                    entry = CatalogEntry.model_validate_json(raw)
                    if entry.registration == registration:
                        return entry
                for _, raw in await rejections.poll(0.05):
                    rej = Rejection.model_validate_json(raw)
                    if (
                        rej.stream_id == registration.stream_id
                        and rej.source_topic == self.topics.registrations
                    ):
                        return rej
            raise TimeoutError(f"no catalog entry for {registration.stream_id} in {timeout}s")
        finally:
            await catalog.stop()
            await rejections.stop()

    async def publish(
        self,
        stream_id: str,
        values: Sequence[float],
        *,
        value_id: str | None = None,
        published_at_ms: int | None = None,
    ) -> str:
        """Publish a value; return its id.

        A resend keeps its identity: the same id is sent with its original publication time —
        ``published_at_ms`` if given, else the time this client first published that id — so
        the market recognises it (and a resend it has forgotten is refused as too old, not
        taken for a new value).
        """
        vid = value_id or uuid.uuid4().hex[:16]
        stamp = published_at_ms or self._published.get((stream_id, vid))
        if stamp is None:
            stamp = time.time_ns() // 1_000_000
        self._published[(stream_id, vid)] = stamp
        ev = ValueEvent(
            stream_id=stream_id, value_id=vid, values=list(values), published_at_ms=stamp
        )
        await self.send(self.topics.values, stream_id, ev.model_dump_json().encode())
        return vid

    def published_at(self, stream_id: str, value_id: str) -> int | None:
        """When this client first published ``value_id`` (what a resend must carry)."""
        return self._published.get((stream_id, value_id))

    async def catalog(self, *, settle: float = 0.5) -> dict[str, CatalogEntry]:
        reader = TopicReader(self.bootstrap, self.topics.catalog, **self.auth)
        await reader.start()
        out: dict[str, CatalogEntry] = {}
        try:
            while True:
                batch = await reader.poll(settle)
                if not batch:
                    return out
                for _, raw in batch:
                    entry = CatalogEntry.model_validate_json(raw)
                    out[entry.registration.stream_id] = entry
        finally:
            await reader.stop()

    # -- buyers ------------------------------------------------------------------------------
    async def _buyer_reader(self, buyer_id: str) -> TopicReader:
        with contextlib.suppress(Exception):  # buyers may lack the right to create topics
            await ensure_topics(self.bootstrap, [self.topics.buyer_spec(buyer_id)], **self.auth)
        reader = TopicReader(self.bootstrap, self.topics.buyer(buyer_id), **self.auth)
        await reader.start()
        return reader

    async def _request(
        self,
        buyer_id: str,
        stream_id: str,
        request_id: str,
        payload: bytes,
        *,
        timeout: float,
        resend_every: float,
    ) -> BuyerEvent:
        reader = await self._buyer_reader(buyer_id)
        try:
            deadline = time.monotonic() + timeout
            next_send = 0.0
            while time.monotonic() < deadline:
                if time.monotonic() >= next_send:
                    await self.send(self.topics.purchases, stream_id, payload)
                    next_send = time.monotonic() + resend_every
                for key, raw in await reader.poll(0.2):
                    if key != request_id.encode():
                        continue
                    ev = BUYER_EVENT.validate_json(raw)
                    if isinstance(ev, Rejection | PurchaseFulfilled | QuoteAnswer):
                        return ev
            raise TimeoutError(f"no answer to {request_id} within {timeout}s")
        finally:
            await reader.stop()

    async def buy(
        self,
        buyer_id: str,
        stream_id: str,
        *,
        target_level: float | None = None,
        max_price_minor: int,
        currency: str = "EUR",
        purchase_id: str | None = None,
        timeout: float = 60.0,
        resend_every: float = 15.0,
        key: X25519PrivateKey | None = None,
        requested_at_ms: int | None = None,
    ) -> PurchaseFulfilled | Rejection:
        """Buy and wait for the outcome, resending the same request until it arrives.

        With ``key`` the releases are sealed for it and returned opened (the event keeps the
        envelope, which the receipt binds). A purchase id keeps its identity: its request time
        is ``requested_at_ms`` if given, else the time this client first sent that id.
        """
        pid = purchase_id or uuid.uuid4().hex[:20]
        stamp = requested_at_ms or self._requested.setdefault(
            (buyer_id, pid), time.time_ns() // 1_000_000
        )
        req = PurchaseRequest(
            purchase_id=pid,
            buyer_id=buyer_id,
            stream_id=stream_id,
            target_level=target_level,
            max_price_minor=max_price_minor,
            currency=currency,
            requested_at_ms=stamp,
            buyer_public_key=None if key is None else public_key_b64(key),
        )
        ev = await self._request(
            buyer_id,
            stream_id,
            pid,
            req.model_dump_json().encode(),
            timeout=timeout,
            resend_every=resend_every,
        )
        if key is not None:
            ev = open_event(ev, key)
        assert isinstance(ev, PurchaseFulfilled | Rejection)
        return ev

    async def quote(
        self,
        buyer_id: str,
        stream_id: str,
        *,
        target_level: float | None = None,
        timeout: float = 30.0,
    ) -> QuoteAnswer | Rejection:
        qid = uuid.uuid4().hex[:20]
        req = QuoteRequest(
            quote_id=qid, buyer_id=buyer_id, stream_id=stream_id, target_level=target_level
        )
        ev = await self._request(
            buyer_id,
            stream_id,
            qid,
            req.model_dump_json().encode(),
            timeout=timeout,
            resend_every=timeout,
        )
        assert isinstance(ev, QuoteAnswer | Rejection)
        return ev

    async def tail(
        self,
        buyer_id: str,
        *,
        idle_timeout: float | None = None,
        key: X25519PrivateKey | None = None,
    ) -> AsyncIterator[BuyerEvent]:
        """Every event on the buyer's topic from the beginning (sealed releases opened with
        ``key``); stops after ``idle_timeout`` seconds without events."""
        reader = await self._buyer_reader(buyer_id)
        try:
            idle_since = time.monotonic()
            while idle_timeout is None or time.monotonic() - idle_since < idle_timeout:
                batch = await reader.poll(0.3)
                if batch:
                    idle_since = time.monotonic()
                for _, raw in batch:
                    ev = BUYER_EVENT.validate_json(raw)
                    yield ev if key is None else open_event(ev, key)
        finally:
            with contextlib.suppress(Exception):
                await reader.stop()
