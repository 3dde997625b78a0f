"""What the worker's web endpoints answer: ``/metrics``, ``/health`` and ``/ledger``.

The bodies are computed here from the core's stores and the metrics; :mod:`streams.worker.app`
only routes the pages to these functions. Anyone who reaches the port may read them, so none
names a buyer: ``/metrics`` and ``/health`` carry no per-buyer label or field, and ``/ledger``
shows each stream's aggregates unless the request carries the operators' credential
(``Authorization: Bearer <token>``, :attr:`~streams.core.keys.MarketKeys.operator_token`), when it
also lists each buyer's level, payments and purchases.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from market import ChainState
from market.privacy_units import level_of

from ..core import MarketKeys, Stores
from ..core.allowance import Allowance
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


def ledger_access(authorization: str | None, keys: MarketKeys) -> bool | None:
    """Whether a ``/ledger`` request may see per-buyer detail: True with the operators' bearer
    token, False without an ``Authorization`` header, None (refuse: 401) with another one."""
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    expected = keys.operator_token.encode("ascii")
    given = token.strip().encode("utf-8", "replace")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(given, expected)
    return True if ok else None


def ledger(stores: Stores, keys: MarketKeys, *, per_buyer: bool = False) -> dict[str, Any]:
    """Per-stream revenue and privacy spent, for this worker's streams; each buyer's holdings
    only with ``per_buyer`` (the operators' credential), else just how many buyers hold."""
    streams, unserved = {}, []
    for sid, stored in stores.streams.items():
        try:
            st = with_registration(stores, sid, stored)
        except InconsistentStream:  # not served: listed, not summed
            unserved.append(sid)
            continue
        reg = st.registration
        holders = holders_of(stores, sid, stored)
        streams[sid] = {
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
        }
        if per_buyer:
            streams[sid]["holders"] = {b: h.model_dump() for b, h in holders.items()}
    return {
        "market_key_id": keys.key_id,
        "per_buyer": per_buyer,
        "streams": streams,
        "unserved": sorted(unserved),
    }
