"""What the worker's web endpoints answer: ``/metrics``, ``/health`` and ``/ledger``.

The bodies are computed here from the core's stores and the metrics; :mod:`streams.worker.app`
routes the pages to these functions and serves ``/ledger`` and ``/metrics`` from a
:class:`~streams.worker.page_cache.PageCache`. Anyone who reaches the port may read ``/health``
and ``/metrics``, so neither names a buyer (no per-buyer label or field); ``/ledger`` (each
stream's figures and each buyer's level, payments and purchases) answers only a request with
the operators' credential (``Authorization: Bearer <token>``,
:attr:`~streams.core.keys.MarketKeys.operator_token`), 401 otherwise.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from market import ChainState
from market.privacy_units import level_of

from ..core import MarketKeys, Stores
from ..core.allowance import Allowance
from ..core.holds import held_count
from ..core.ledger import latest_status
from ..core.state import InconsistentStream, with_registration
from ..core.stream_store import holders_of
from ..wire.events import UNIT_OF
from ..wire.topics import Topics
from .config import Settings
from .faust_internals import committed_offset
from .metrics import Metrics

__all__ = [
    "METRICS_CONTENT_TYPE",
    "VectorBytes",
    "health",
    "input_lag",
    "is_stalled",
    "ledger",
    "ledger_access",
    "ledger_page",
    "metrics_page",
    "metrics_text",
    "refresh_gauges",
]

# aiohttp refuses a charset inside content_type; the exposition format is ASCII
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST.split(";")[0] + "; version=0.0.4"


def input_lag(consumer: Any, topics: Topics) -> dict[str, int]:
    """Messages waiting on this worker's input partitions, by topic (high watermark minus the
    committed offset; empty before the consumer has started)."""
    lag: dict[str, int] = {}
    try:
        for tp in consumer.assignment():
            if tp.topic not in topics.inputs():
                continue
            hw = consumer.highwater(tp)
            pos = committed_offset(consumer, tp)
            if hw is not None and pos is not None:
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, int(hw) - int(pos))
    except Exception:  # consumer not started yet
        return {}
    return lag


class VectorBytes:
    """``emarket_state_vector_bytes`` without an O(state) pause: a pass over the releases
    store, at most :attr:`per_refresh` entries per call.

    Summing every value's vectors at once blocked the event loop on every refresh (every 5 s
    and every scrape): ~20 ms with a benchmark's few thousand values, seconds with millions,
    and a purchase that arrived meanwhile waited it out. A pass starts from a snapshot of the
    keys (entries written meanwhile are counted by the next pass, entries gone are skipped)
    and the gauge shows the last completed pass.
    """

    def __init__(self, per_refresh: int = 1024) -> None:
        self.per_refresh = per_refresh
        self._keys: list[str] = []
        self._at = 0
        self._sum = 0
        self.last: int | None = None

    def step(self, releases: Any) -> int | None:
        """Scan the next entries; return the total of the last completed pass (None before)."""
        if self._at >= len(self._keys):
            self._keys, self._at, self._sum = list(releases.keys()), 0, 0
        chunk = self._keys[self._at : self._at + self.per_refresh]
        self._at += len(chunk)
        for key in chunk:
            value = releases.get(key)
            if isinstance(value, ChainState):
                self._sum += value.nbytes
        if self._at >= len(self._keys):
            self.last = self._sum
        return self.last


def refresh_gauges(
    metrics: Metrics,
    stores: Stores,
    consumer: Any,
    topics: Topics,
    stall_seconds: float,
    started: float,
    vectors: VectorBytes | None = None,
) -> None:
    """Update the gauges that are read off the state and the consumer, not counted —
    including ``emarket_stalled``, by the same rule as ``/health``, so that an alert can fire
    on exactly what the health check reports. Nothing here walks the whole state."""
    for name in Stores.NAMES:
        metrics.state_entries.labels(name).set(len(getattr(stores, name)))
    total = (vectors or VectorBytes(per_refresh=2**62)).step(stores.releases)
    if total is not None:
        metrics.state_bytes.set(total)
    lag = input_lag(consumer, topics)
    for topic in topics.inputs():
        metrics.consumer_lag.labels(topic).set(lag.get(topic, 0))
    # as /health: a worker that cannot reach the broker is "degraded" (its own alert), not stalled
    pending = sum(lag.values())
    stalled = metrics.broker_is_up and is_stalled(metrics, stall_seconds, started, pending)
    metrics.stalled.set(1 if stalled else 0)


def is_stalled(metrics: Metrics, stall_seconds: float, started: float, pending: int) -> bool:
    """Input waits and no batch has completed for ``stall_seconds``, or one batch has been
    running that long.

    Both signals are needed: the committed-offset lag misses a batch that was fetched (and so
    counted as consumed) but hangs, and a running batch misses input that is waiting while the
    agent never gets a batch at all.
    """
    now = time.time()
    last = metrics.last_batch_at
    idle = now - (last if last is not None else started)
    running = metrics.batch_started_at
    return (pending > 0 and idle > stall_seconds) or (
        running is not None and now - running > stall_seconds
    )


def metrics_text(metrics: Metrics) -> bytes:
    return bytes(generate_latest(metrics.registry))


def health(
    metrics: Metrics,
    settings: Settings,
    keys: MarketKeys,
    started: float,
    pending: int,
    unverified: Mapping[str, str] | None = None,
    group: dict[str, Any] | None = None,
    openings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``/health``: "ok", else "degraded" (the broker does not answer), "unverified" (state
    recovered here is not what its checkpoint commits: ``unverified`` says where and how),
    "untrusted_group" (input partitions are not all held by proven workers of this market, or
    this worker was refused its place: ``group`` says which and why,
    :mod:`streams.worker.group_watch`) or "stalled" (see :func:`is_stalled`, with
    ``EMARKET_STALL_SECONDS``); all served as 503. ``openings`` says whether account openings
    fall behind (:func:`openings_health`): not a reason for a 503, which would have the worker
    restarted, but for an alert (``MarketOpeningsBehind``)."""
    now = time.time()
    last = metrics.last_batch_at
    running = metrics.batch_started_at
    status = "ok"
    if not metrics.broker_is_up:
        status = "degraded"
    elif unverified:
        status = "unverified"
    elif group is not None and not group["ok"]:
        status = "untrusted_group"
    elif is_stalled(metrics, settings.stall_seconds, started, pending):
        status = "stalled"
    return {
        "status": status,
        "unverified": dict(unverified or {}),
        "input_pending": pending,
        "app_id": settings.app_id,
        "broker": settings.broker,
        "uptime_s": round(time.time() - started, 1),
        "last_batch_age_s": None if last is None else round(now - last, 3),
        "running_batch_age_s": None if running is None else round(now - running, 3),
        "market_key_id": keys.key_id,
        "group": group,
        "openings": openings,
    }


def openings_health(
    settings: Settings, allowance: Allowance, inboxes_waiting: int
) -> dict[str, Any]:
    """Account openings on this worker: the mode, the proof of work an opening carries, the
    openings refused ``rate_limited`` (the allowance spent: honest openings are refused too)
    and the inbox topics waiting to be made; ``behind`` when one was refused within the last
    minute or more inboxes wait than one creation request makes (``EMARKET_INBOX_BATCH``)."""
    refused_recently = allowance.openings_behind()
    return {
        "mode": settings.limits.openings,
        "work_bits": settings.limits.opening_work if settings.limits.openings == "open" else 0,
        "per_minute": allowance.openings_per_minute,
        "refused_rate_limited": allowance.openings_refused,
        "last_refused_at_ms": allowance.openings_refused_at_ms,
        "inboxes_waiting": inboxes_waiting,
        "behind": refused_recently or inboxes_waiting > settings.inbox_batch,
    }


def ledger_access(authorization: str | None, keys: MarketKeys) -> bool:
    """Whether a ``/ledger`` request carries the operators' bearer token (else: 401)."""
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    expected = keys.operator_token.encode("ascii")
    given = token.strip().encode("utf-8", "replace")
    return scheme.lower() == "bearer" and hmac.compare_digest(given, expected)


def ledger(stores: Stores, keys: MarketKeys) -> dict[str, Any]:
    """Per-stream revenue and privacy spent, for this worker's streams, with each buyer's
    holding (the operators' page; :func:`ledger_page` builds its bytes in slices)."""
    streams, unserved = {}, []
    for sid, stored in stores.streams.items():
        entry = stream_entry(stores, sid, stored)
        if entry is None:
            unserved.append(sid)
        else:
            streams[sid] = entry
    return {
        "market_key_id": keys.key_id,
        "per_buyer": True,
        "streams": streams,
        "unserved": sorted(unserved),
    }


SLICE_S = 0.002
"""Seconds of work a page build does before it lets the event loop run what waits (a batch's
next step, a request): the longest a build holds the loop."""


class Slices:
    """Where a long build on the event loop lets the loop run: every :data:`SLICE_S` seconds."""

    def __init__(self, budget: float = SLICE_S) -> None:
        self.budget = budget
        self._since = time.perf_counter()

    async def pause(self) -> None:
        if time.perf_counter() - self._since >= self.budget:
            await asyncio.sleep(0)
            self._since = time.perf_counter()


async def ledger_page(stores: Stores, keys: MarketKeys, budget: float = SLICE_S) -> bytes:
    """``/ledger``'s body (:func:`ledger`'s, as JSON) built in slices on the event loop.

    On the loop, not in a thread: the batches change stream records in place (the stores hold
    the objects the core mutates), so a thread would have to copy every record first, which
    costs what the build does. Between slices a batch may run: each stream's entry is its
    state between two steps of a batch, as the page was when built at once; a stream
    registered meanwhile is on the next build, one gone meanwhile is left out."""
    slices = Slices(budget)
    parts: list[str] = []
    unserved: list[str] = []
    for sid in list(stores.streams.keys()):
        await slices.pause()
        stored = stores.streams.get(sid)
        if stored is None:
            continue
        entry = stream_entry(stores, sid, stored)
        if entry is None:
            unserved.append(sid)
        else:
            parts.append(f"{json.dumps(sid)}: {json.dumps(entry)}")
    head = json.dumps({"market_key_id": keys.key_id, "per_buyer": True})[:-1]
    streams = "{" + ", ".join(parts) + "}"
    return f'{head}, "streams": {streams}, "unserved": {json.dumps(sorted(unserved))}}}'.encode()


async def metrics_page(metrics: Metrics) -> bytes:
    """``/metrics``' body, built in a thread: prometheus-client reads every value under its own
    locks (the batches write them under the same locks), so a thread reads them safely, and the
    loop is held only for the moments the thread gives back the interpreter."""
    return await asyncio.to_thread(metrics_text, metrics)


def stream_entry(stores: Stores, sid: str, stored: Any) -> dict[str, Any] | None:
    """One stream's line of the ledger, None when its record has no registration (a bug: the
    stream is not served, and listed as ``unserved``)."""
    try:
        st = with_registration(stores, sid, stored)
    except InconsistentStream:
        return None
    reg = st.registration
    holders = holders_of(stores, sid, stored)
    return {
        "seller_id": reg.seller_id,
        "mechanism": reg.mechanism,
        "level_unit": UNIT_OF[reg.mechanism],
        "currency": reg.currency,
        "cap": reg.cap,
        "privacy_spent": level_of(st.spent_nano),
        "privacy_unit": reg.privacy_unit,
        "privacy_window": None
        if reg.window is None
        else {
            "duration_ms": reg.window.duration_ms,
            "cap": reg.window.cap,
            "latest": None if (ws := latest_status(st)) is None else ws.model_dump(),
            "spent_by_window_start_ms": {
                str(k * reg.window.duration_ms): level_of(v)
                for k, v in sorted(st.window_spent_nano.items())
            },
        },
        "revenue_minor": st.revenue_minor,
        "values_ingested": st.values_ingested,
        "holder_count": len(holders),
        "reservations_held": held_count(st.reservations),
        "holders": {b: h.model_dump() for b, h in holders.items()},
    }
