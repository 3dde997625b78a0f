"""A market core on plain dicts for the red team's attacks: register, publish, buy, look."""

from __future__ import annotations

from typing import Any

from streams.core import MarketCore
from streams.core.codecs import encode_stream
from streams.core.state import StreamState
from streams.wire.events import INBOX_EVENT, Rejection
from streams.wire.topics import Topics

from .. import helpers
from ..helpers import market_core, registration, value

T = Topics("t")
W = 60_000
NOW = 10**9
BUYERS = ("alice", "bob", "carol", "dave")


def core(**reg: Any) -> MarketCore:
    """A core where seller1 registered stream ``s`` with ``reg`` (it must be accepted)."""
    c = market_core("seller1", *BUYERS, now=NOW)
    out = c.handle(T.registrations, registration("s", **reg))
    assert out.status == "accepted", out.outputs[0].value
    return c


def windowed(steps: list[float], cap: float, window_cap: float, **kw: Any) -> MarketCore:
    """A ``window`` stream ``s`` (windows of one minute) with these levels and caps."""
    kw.setdefault("retain_last", 16)
    return core(
        steps=steps,
        cap=cap,
        privacy_unit="window",
        window={"duration_ms": W, "cap": window_cap},
        **kw,
    )


def buy(c: MarketCore, buyer: str, pid: str, level: float, **kw: Any) -> Any:
    kw.setdefault("requested_at_ms", NOW)
    kw.setdefault("max_price", 10**15)
    return c.handle(T.purchases, helpers.purchase("s", buyer, pid, target_level=level, **kw))


def publish(c: MarketCore, vid: str, at_ms: int) -> Any:
    out = c.handle(T.values, value("s", vid, [1.0, 2.0, 3.0], published_at_ms=at_ms))
    assert out.status == "accepted", out.outputs
    return out


def state(c: MarketCore) -> StreamState:
    st = c.stores.streams["s"]
    assert isinstance(st, StreamState)
    return st


def snapshot(c: MarketCore) -> bytes:
    """The stream's record as stored: every field a release or a charge writes."""
    return encode_stream(state(c))


def received(outcome: Any, who: str) -> list[str]:
    """The types of the events ``outcome`` sent to ``who``'s inbox."""
    return [
        INBOX_EVENT.validate_json(o.value).type for o in outcome.outputs if o.topic == T.inbox(who)
    ]


def refusal(out: Any) -> Rejection:
    assert out.status == "rejected", [o.value[:300] for o in out.outputs]
    return Rejection.model_validate_json(out.outputs[0].value)
