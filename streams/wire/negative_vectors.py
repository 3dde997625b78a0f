"""Negative vectors (``docs/vectors/negative.json``, docs/protocol.md §10.1): inputs every
implementation must refuse, each with the reason.

Two kinds. What a **client** checks on what it receives — an answer's ``emarket-answer`` header
(none, null, doubled, oversized, another key, another inbox, other bytes), a receipt (a bad
signature, another market key id, numbers that are not the committed ones), an envelope that
does not open, a trust root that is not the market's — which both clients run. And what the
**market** refuses — for each refusal code of §9 that one market can be driven to, the events
that lead to it and the one it refuses — which the Python tests replay against the market's
core. ``python -m streams vectors`` writes the file beside the others and a test regenerates it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from market.envelope import public_key_b64

from . import receipt_vectors, root_vectors
from .answers import answer_header
from .events import (
    OpenAccount,
    PurchaseRequest,
    QuoteRequest,
    ReserveRequest,
    RotateKeys,
    StreamRegistration,
    ValueBatch,
)
from .signing import MarketRef, _v1_bytes, public_b64, sign, signed

__all__ = ["MARKET_CASES", "UNREACHED", "negative"]

_MARKET_SEED = bytes(range(32))
_NOISE_SECRET = b"n" * 32
_MARKET = "t"
_MARKET_KEY = Ed25519PrivateKey.from_private_bytes(_MARKET_SEED)
_FOR = MarketRef(
    _MARKET, hashlib.sha256(_MARKET_KEY.public_key().public_bytes_raw()).hexdigest()[:16]
)
_SEALING = X25519PrivateKey.from_private_bytes(
    hmac.digest(_NOISE_SECRET, b"emarket market sealing key v1", "sha256")
)
_SEAL_SEED = b"emarket negative vectors: a public seed, never used to seal real values"
_NOW = 1_700_000_000_000


def _key(name: str) -> Ed25519PrivateKey:
    """A party's signing key, a function of its name (the vectors sign as anyone they name)."""
    return Ed25519PrivateKey.from_private_bytes(
        hashlib.sha256(b"emarket negative vectors: " + name.encode()).digest()
    )


def _dump(event: Any) -> str:
    return str(event.model_dump_json())


# ------------------------------------------------------------------------- signed events
def _open(name: str, signer: str | None = None, **kw: Any) -> dict[str, Any]:
    key = _key(signer or name)
    fields = {
        "account_id": name,
        "signing_key": public_b64(key.public_key()),
        "opened_at_ms": _NOW,
        **kw,
    }
    return {"topic": "t.accounts", "value": _dump(signed(OpenAccount, _FOR, key, **fields))}


def _rotate(name: str, new: str, version: int, signer: str | None = None) -> dict[str, Any]:
    fields = {
        "account_id": name,
        "version": version,
        "signing_key": public_b64(_key(new).public_key()),
        "rotated_at_ms": _NOW,
        "new_key_signature": "A" * 86 + "==",
    }
    draft = signed(RotateKeys, _FOR, _key(signer or name), generation=version - 1, **fields)
    both = draft.model_copy(update={"new_key_signature": sign(_FOR, draft, _key(new))})
    return {"topic": "t.accounts", "value": _dump(both)}


_REGISTRATION: dict[str, Any] = {
    "stream_id": "temp",
    "seller_id": "seller1",
    "mechanism": "laplace",
    "sensitivity": 1.0,
    "dimension": 3,
    "steps": [0.5, 1.0, 2.0],
    "cap": 4.0,
    "retain_last": 4,
    "pricing": {"kind": "linear_level", "rate_per_level": 100},
    "currency": "EUR",
}


def _register(signer: str = "seller1", **kw: Any) -> dict[str, Any]:
    fields = {**_REGISTRATION, **kw}
    try:
        event = signed(StreamRegistration, _FOR, _key(signer), **fields)
    except ValueError:  # a registration the wire model refuses: it is never signed
        return _unsigned("t.registrations", {"type": "register_stream", **fields})
    return {"topic": "t.registrations", "value": _dump(event)}


def _unsigned(topic: str, body: dict[str, Any]) -> dict[str, Any]:
    """An event the wire model refuses, with a placeholder signature (the market refuses it
    before it reads one)."""
    doc = {**body, "key_id": "0" * 16, "signature": "A" * 86 + "=="}
    return {"topic": topic, "value": json.dumps(doc, separators=(",", ":"))}


def _v1(model: Any, signer: str, **fields: Any) -> str:
    """An event signed over the first version's bytes, which name no market key (§2)."""
    draft = model.model_validate({**fields, "key_id": _kid(signer), "signature": "A" * 86 + "=="})
    sig = _key(signer).sign(_v1_bytes(_MARKET, draft, 1))
    return _dump(draft.model_copy(update={"signature": base64.b64encode(sig).decode()}))


def _kid(name: str) -> str:
    raw = _key(name).public_key().public_bytes_raw()
    return hashlib.sha256(raw).hexdigest()[:16]


def _values(
    items: list[dict[str, Any]], *, stream: str = "temp", seller: str = "seller1", **kw: Any
) -> dict[str, Any]:
    from .sealing import seal_values  # noqa: PLC0415

    signer = kw.pop("signer", seller)
    to = kw.pop("to", _SEALING)
    full = [{"published_at_ms": _NOW, **i} for i in items]
    placeholder = {"key_id": "0" * 16, "signature": "A" * 86 + "=="}
    seq = kw.pop("batch_seq", None)
    numbered = {} if seq is None else {"batch_seq": max(0, seq)}
    clear = ValueBatch.model_validate(
        {"stream_id": stream, "seller_id": seller, "items": full, **placeholder, **numbered}
    )
    sealed = seal_values(clear, _MARKET, public_key_b64(to), seed=_SEAL_SEED)
    body = sealed.model_dump(exclude={"key_id", "signature"})
    text = _dump(signed(ValueBatch, _FOR, _key(signer), **body))
    if seq is not None and seq < 0:  # no model holds it: the number is written over 0
        text = text.replace('"batch_seq":0', f'"batch_seq":{seq}')
    return {"topic": "t.values", "value": text}


def _buy(signer: str = "alice", **kw: Any) -> dict[str, Any]:
    fields = {
        "purchase_id": "p1",
        "buyer_id": "alice",
        "stream_id": "temp",
        "max_price_minor": 1_000_000,
        "requested_at_ms": _NOW,
        **kw,
    }
    return {
        "topic": "t.purchases",
        "value": _dump(signed(PurchaseRequest, _FOR, _key(signer), **fields)),
    }


def _quote(signer: str = "alice", **kw: Any) -> dict[str, Any]:
    fields = {
        "quote_id": "q1",
        "buyer_id": "alice",
        "stream_id": "temp",
        "requested_at_ms": _NOW,
        **kw,
    }
    return {
        "topic": "t.purchases",
        "value": _dump(signed(QuoteRequest, _FOR, _key(signer), **fields)),
    }


def _reserve(signer: str = "alice", **kw: Any) -> dict[str, Any]:
    fields = {
        "reservation_id": "r1",
        "buyer_id": "alice",
        "stream_id": "temp",
        "hold_ms": 60_000,
        "requested_at_ms": _NOW,
        **kw,
    }
    return {
        "topic": "t.purchases",
        "value": _dump(signed(ReserveRequest, _FOR, _key(signer), **fields)),
    }


def _raw(topic: str, value: bytes | None) -> dict[str, Any]:
    return {"topic": topic, "value_hex": None if value is None else value.hex()}


BASE = [_open("seller1"), _open("alice"), _register()]
"""What every market case starts from: a seller, a buyer and the stream ``temp``."""
WITH_VALUE = [*BASE, _values([{"value_id": "v0", "values": [1.0, 2.0, 3.0]}])]


def _case(
    code: str, why: str, setup: list[dict[str, Any]], event: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    """One market case: ``setup`` accepted in order, then ``event`` refused with ``code``."""
    return {
        "code": code,
        "why": why,
        "now_ms": kw.pop("now_ms", _NOW),
        "limits": kw.pop("limits", {}),
        "market": kw.pop("market", {}),
        "setup": setup,
        "input": {**event, **({"partition": kw.pop("partition")} if "partition" in kw else {})},
        "answered_by": kw.pop("answered_by", "rejection"),
    }


def _any_event() -> list[dict[str, Any]]:
    big = json.dumps({"type": "purchase", "pad": "x" * 5000}).encode()
    return [
        _case(
            "too_large",
            "a record above the market's bound (here 4,096 bytes)",
            [],
            _raw("t.purchases", big),
            limits={"max_message_bytes": 4096},
        ),
        _case("unknown_topic", "a topic the market does not read", BASE, _raw("t.nosuch", b"{}")),
    ]


def _malformed() -> list[dict[str, Any]]:
    """Records that are not events: null, not JSON, not UTF-8, not an object."""
    return [
        _case("invalid_event", "a null value (a tombstone)", BASE, _raw("t.purchases", None)),
        _case("invalid_event", "not JSON", BASE, _raw("t.purchases", b"garbage")),
        _case("invalid_event", "not UTF-8", BASE, _raw("t.purchases", b"\xff\xfe{}")),
        _case("invalid_event", "a JSON array", BASE, _raw("t.purchases", b"[]")),
        _case(
            "invalid_event",
            "an unknown type",
            BASE,
            _raw("t.purchases", b'{"type":"gift","stream_id":"temp"}'),
        ),
        _case(
            "invalid_event",
            "a field missing (max_price_minor)",
            BASE,
            _unsigned(
                "t.purchases",
                {
                    "type": "purchase",
                    "purchase_id": "p1",
                    "buyer_id": "alice",
                    "stream_id": "temp",
                    "requested_at_ms": _NOW,
                },
            ),
        ),
        _case(
            "invalid_event",
            "a purchase on the values topic",
            WITH_VALUE,
            {**_buy(), "topic": "t.values"},
        ),
    ]


def _any_event_rules() -> list[dict[str, Any]]:
    """§9's rules of any event: numbers, tables, accounts, signatures."""
    return [
        _case(
            "unsafe_integer",
            "an integer beyond 2^53 - 1 (requested_at_ms)",
            BASE,
            _unsigned(
                "t.purchases",
                {
                    "type": "purchase",
                    "purchase_id": "p1",
                    "buyer_id": "alice",
                    "stream_id": "temp",
                    "requested_at_ms": 2**53,
                    "max_price_minor": 100,
                },
            ),
        ),
        _case(
            "duplicate_price_level",
            "a price table naming the level 1 twice",
            BASE[:1],
            _register(
                stream_id="dup",
                pricing={"kind": "table", "prices": {"0.5": 5, "1": 10, "1.0": 1, "2": 20}},
            ),
        ),
        _case("unknown_account", "an account never opened", BASE, _buy("carol", buyer_id="carol")),
        _case(
            "bad_signature", "alice's purchase signed by mallory's key", WITH_VALUE, _buy("mallory")
        ),
        _case(
            "old_signature_format",
            "signed over the first version's bytes",
            WITH_VALUE,
            {
                "topic": "t.purchases",
                "value": _v1(
                    PurchaseRequest,
                    "alice",
                    purchase_id="p1",
                    buyer_id="alice",
                    stream_id="temp",
                    max_price_minor=100,
                    requested_at_ms=_NOW,
                ),
            },
        ),
    ]


def _any_event_keys() -> list[dict[str, Any]]:
    """§9's codes of keys, partitions and allowances."""
    return [
        _case(
            "key_rotated",
            "signed with the key alice rotated away from",
            [*WITH_VALUE, _rotate("alice", "alice-2", 2)],
            _buy("alice"),
        ),
        _case(
            "wrong_partition",
            "alice's rotation signed by mallory, on another partition than alice's",
            BASE,
            _rotate("alice", "alice-2", 2, signer="mallory"),
            partition=0,
        ),
        _case(
            "rate_limited",
            "a quote over the allowance of 1 a minute",
            [*WITH_VALUE, _quote(quote_id="q0")],
            _quote(quote_id="q1"),
            limits={"max_quotes_per_minute": 1},
        ),
        _case(
            "request_too_old",
            "a quote asked more than an hour ago",
            WITH_VALUE,
            _quote(requested_at_ms=_NOW - 3_600_001),
            now_ms=_NOW,
        ),
    ]


def _accounts() -> list[dict[str, Any]]:
    return [
        _case(
            "account_exists",
            "alice's id opened again with another key",
            BASE,
            _open("alice", signer="alice-2"),
        ),
        _case(
            "stale_key_version",
            "a rotation to version 3 of an account at version 1",
            BASE,
            _rotate("alice", "alice-2", 3),
        ),
        _case(
            "invalid_key",
            "a signing key of small order (the identity point)",
            BASE,
            _open_small_order("dave"),
        ),
        _case(
            "too_many_accounts",
            "an opening beyond the market's 2 accounts",
            BASE,
            _open("dave"),
            limits={"max_accounts": 2},
        ),
        _case(
            "invitation_required",
            "an opening with no invitation where one is needed",
            [],
            _open("dave"),
            limits={"openings": "invite"},
        ),
        _case(
            "more_work",
            "an opening without the proof of work an open market wants",
            [],
            _open("dave"),
            limits={"opening_work": 8},
        ),
        _case(
            "bad_invitation",
            "an invitation signed by someone else than the market",
            [],
            _open("dave", invitation=_invitation("dave", _key("mallory"))),
            limits={"openings": "invite"},
        ),
        _case(
            "invitation_expired",
            "an invitation whose expires_at_ms has passed",
            [],
            _open("dave", invitation=_invitation("dave", _MARKET_KEY, _NOW - 1)),
            limits={"openings": "invite"},
        ),
    ]


def _invitation(name: str, key: Ed25519PrivateKey, expires: int = _NOW + 1) -> dict[str, Any]:
    from .invitations import invite  # noqa: PLC0415

    return dict(invite(key, _MARKET, name, expires).model_dump())


def _open_small_order(name: str) -> dict[str, Any]:
    """An opening naming the identity point as its signing key (§5.1), signed by nobody."""
    body = {
        "type": "open_account",
        "account_id": name,
        "signing_key": "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "opened_at_ms": _NOW,
    }
    return _unsigned("t.accounts", body)


def _registrations() -> list[dict[str, Any]]:
    return [
        _case(
            "stream_exists",
            "the stream id registered again with other fields",
            BASE,
            _register(dimension=4),
        ),
        _case(
            "invalid_level",
            "a level above 10^9",
            BASE[:1],
            _register(stream_id="s2", steps=[0.5, 2e9], cap=4e9),
        ),
        _case(
            "invalid_schedule",
            "prices that fall as the level rises",
            BASE[:1],
            _register(
                stream_id="s2", pricing={"kind": "table", "prices": {"0.5": 50, "1": 40, "2": 30}}
            ),
        ),
        _case(
            "too_many_streams",
            "a second stream of seller1 on the partition of temp, where a seller may hold one",
            BASE,
            _register(stream_id="s4"),
            limits={"max_streams_per_seller": 1},
        ),
        _case(
            "unknown_account",
            "a registration by a seller never opened",
            BASE[:2],
            _register("erin", seller_id="erin", stream_id="s2"),
        ),
        _case(
            "stream_too_large",
            "a window of 1,000 values of 100,000 numbers",
            BASE[:1],
            _register(stream_id="s2", dimension=100_000, retain_last=1_000),
        ),
    ]


def _value_cases() -> list[dict[str, Any]]:
    v = [{"value_id": "v1", "values": [1.0, 2.0, 3.0]}]
    return [
        _case(
            "unknown_stream",
            "values of a stream never registered",
            BASE,
            _values(v, stream="nosuch"),
        ),
        _case(
            "not_your_stream",
            "alice's values on seller1's stream",
            BASE,
            _values(v, seller="alice"),
        ),
        _case(
            "values_not_sealed",
            "numbers in clear where the market takes sealed ones",
            BASE,
            _clear_values(v),
        ),
        _case(
            "wrong_dimension",
            "two numbers on a 3-dimensional stream",
            BASE,
            _values([{"value_id": "v1", "values": [1.0, 2.0]}]),
            answered_by="values_line",
        ),
        _case(
            "conflicting_value",
            "v0 published again with other numbers",
            WITH_VALUE,
            _values([{"value_id": "v0", "values": [9.0, 9.0, 9.0]}]),
            answered_by="values_line",
        ),
        _case(
            "batch_seq_out_of_window",
            "a first batch numbered 257: more than 256 above the numbers the stream applied",
            BASE,
            _values(v, batch_seq=257),
        ),
        _case(
            "invalid_event",
            "a batch numbered -1",
            BASE,
            _values(v, batch_seq=-1),
        ),
        _case(
            "bad_seal",
            "numbers sealed to another key than the market's",
            BASE,
            _values([{"value_id": "v1", "values": [1.0, 2.0, 3.0]}], to=_key_x25519("mallory")),
        ),
    ]


def _value_lines() -> list[dict[str, Any]]:
    """§9's codes of one value's line in a batch the market otherwise takes."""
    return [
        _case(
            "invalid_count",
            "a negative count on a counts stream",
            _COUNTS,
            _values([{"value_id": "c1", "values": [-1.0]}], stream="counts"),
            answered_by="values_line",
        ),
        _case(
            "invalid_value",
            "a count beyond 2^53 - 1",
            _COUNTS,
            _values([{"value_id": "c1", "values": [1e17]}], stream="counts"),
            answered_by="values_line",
        ),
        _case(
            "value_too_old",
            "published 8 days before the stream's newest value",
            WITH_VALUE,
            _values(
                [
                    {
                        "value_id": "v1",
                        "values": [1.0, 2.0, 3.0],
                        "published_at_ms": _NOW - 8 * 86_400_000,
                    }
                ]
            ),
            answered_by="values_line",
        ),
        _case(
            "batch_too_large",
            "25 values where the market's work bound takes 24 at once",
            BASE,
            _values([{"value_id": f"b{i}", "values": [1.0, 2.0, 3.0]} for i in range(25)]),
            limits={"max_event_work": 48_072},
        ),
        _case(
            "value_from_the_future",
            "published more than an hour ahead",
            BASE,
            _values(
                [{"value_id": "v1", "values": [1.0, 2.0, 3.0], "published_at_ms": _NOW + 3_600_001}]
            ),
            answered_by="values_line",
        ),
    ]


def _key_x25519(name: str) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(
        hashlib.sha256(b"emarket negative vectors x25519: " + name.encode()).digest()
    )


_COUNTS = [
    *BASE,
    _register(
        stream_id="counts", mechanism="discrete_laplace", dimension=1, steps=[0.5, 1.0], cap=2.0
    ),
]


def _clear_values(items: list[dict[str, Any]]) -> dict[str, Any]:
    full = [{"published_at_ms": _NOW, **i} for i in items]
    event = signed(
        ValueBatch, _FOR, _key("seller1"), stream_id="temp", seller_id="seller1", items=full
    )
    return {"topic": "t.values", "value": _dump(event)}


def _purchase_cases() -> list[dict[str, Any]]:
    return [
        _case(
            "idempotency_key_reused",
            "p1 sent again with other terms",
            [*WITH_VALUE, _buy()],
            _buy(max_price_minor=999_999),
        ),
        _case(
            "price_too_high", "a step above the price offered", WITH_VALUE, _buy(max_price_minor=1)
        ),
        _case(
            "currency_mismatch", "USD on a stream priced in EUR", WITH_VALUE, _buy(currency="USD")
        ),
        _case(
            "already_held",
            "the level held bought again",
            [*WITH_VALUE, _buy()],
            _buy(purchase_id="p2", target_level=0.5),
        ),
        _case(
            "no_higher_step",
            "a buyer at the top step asks for the next",
            [*WITH_VALUE, _buy(target_level=4.0)],
            _buy(purchase_id="p2"),
        ),
    ]


def _purchase_levels() -> list[dict[str, Any]]:
    """§9's codes of the level or accuracy a purchase asks."""
    return [
        _case(
            "level_not_for_sale",
            "a level the stream does not sell",
            WITH_VALUE,
            _buy(target_level=0.7),
        ),
        _case(
            "level_above_cap", "a level above the stream's cap", WITH_VALUE, _buy(target_level=8.0)
        ),
        _case(
            "accuracy_not_for_sale",
            "an accuracy no level reaches",
            WITH_VALUE,
            _buy(accuracy={"rmse": 1e-9}),
        ),
        _case(
            "encryption_required",
            "no sealing key where releases are sealed only",
            WITH_VALUE,
            _buy(),
            market={"require_encryption": True},
        ),
        _case(
            "request_too_old",
            "a purchase older than the dedup horizon",
            WITH_VALUE,
            _buy(requested_at_ms=_NOW - 9 * 86_400_000),
        ),
        _case(
            "request_from_the_future",
            "requested more than an hour ahead",
            WITH_VALUE,
            _buy(requested_at_ms=_NOW + 3_600_001),
        ),
        _case(
            "unknown_stream",
            "a purchase of a stream never registered",
            WITH_VALUE,
            _buy(stream_id="nosuch"),
        ),
    ]


def _purchase_state() -> list[dict[str, Any]]:
    """§9's codes of a stream's state and a purchase's time."""
    return [
        _case(
            "stream_full",
            "a second buyer where a stream takes one",
            [*WITH_VALUE, _open("bob"), _buy()],
            _buy("bob", buyer_id="bob"),
            limits={"max_holders": 1},
        ),
        _case(
            "privacy_window_full",
            "a level the window has no room for",
            _WINDOW,
            _buy(stream_id="win", target_level=4.0),
        ),
        _case(
            "buyer_quota_exceeded",
            "a level above one buyer's share (half) of the stream's cap of 4",
            [*BASE, _register(stream_id="half", buyer_share=0.5)],
            _buy(stream_id="half", target_level=4.0),
        ),
        _case(
            "already_answered",
            "p1 signed anew within 10 s of its answer (a notice, not a refusal: no refusal record)",
            [*WITH_VALUE, _buy()],
            _buy(requested_at_ms=_NOW + 1),
        ),
    ]


def _reservations() -> list[dict[str, Any]]:
    """§9's codes of reservations (§6.9)."""
    held = [*WITH_VALUE, _reserve()]
    return [
        _case(
            "reservation_limit",
            "a second reservation of one buyer on one stream while the first holds",
            held,
            _reserve(reservation_id="r2"),
        ),
        _case(
            "reservation_unknown",
            "a purchase naming a reservation never made",
            WITH_VALUE,
            _buy(reservation_id="nosuch"),
        ),
        _case(
            "reservation_used",
            "a purchase naming a reservation an earlier purchase used",
            [*held, _buy(reservation_id="r1")],
            _buy(purchase_id="p2", reservation_id="r1"),
        ),
        _case(
            "reservation_mismatch",
            "a purchase naming a reservation and another level",
            held,
            _buy(reservation_id="r1", target_level=1.0),
        ),
    ]


_WINDOW = [
    *BASE,
    _register(
        stream_id="win", privacy_unit="window", window={"duration_ms": 3_600_000, "cap": 4.0}
    ),
    _values(
        [
            {"value_id": "w0", "values": [1.0, 2.0, 3.0]},
            {"value_id": "w1", "values": [1.0, 2.0, 3.0]},
        ],
        stream="win",
    ),
]


MARKET_CASES = (
    _any_event,
    _malformed,
    _any_event_rules,
    _any_event_keys,
    _accounts,
    _registrations,
    _value_cases,
    _value_lines,
    _purchase_cases,
    _purchase_levels,
    _purchase_state,
    _reservations,
)
"""The builders of the market's cases, by section of §9."""

UNREACHED: dict[str, str] = {
    "internal_error": "a failure of the market itself (a bug): no input is meant to draw it",
    "market_secret_mismatch": "state a market with another noise secret made: an operators' "
    "error, not an input",
    "privacy_window_closed": "a value into a window the market has dropped, after more than "
    "MAX_RECENT_WINDOWS windows of values (tests/streams/core/test_windows.py draws it)",
    "reservation_expired": "a purchase naming a reservation after the market's clock passed its "
    "expiry: a case has one clock (tests/streams/core/test_reservations.py draws it)",
    "refusals_dropped": "the summary of more than 20 unproven events in 10 s on one partition, "
    "written when the next batch begins (tests/streams/core/test_refusal_budget.py draws it)",
}
"""§9's codes no case draws, with why: each is drawn by the tests named, or by no input."""


# ------------------------------------------------------------------------- what a client checks
_REQUEST = b'{"type":"purchase","purchase_id":"p1","buyer_id":"alice"}'
_INBOX = "t.inbox.alice"
_ANSWER = b'{"type":"rejection","reason":"price_too_high"}'


def _header_hex(topic: str, request: bytes | None, value: bytes, key: Any = None) -> str:
    digest = None if request is None else hashlib.sha256(request).hexdigest()
    return answer_header(key or _MARKET_KEY, _MARKET, topic, digest, value)[1].hex()


def _answer(name: str, verdict: str, reason: str, **kw: Any) -> dict[str, Any]:
    good = _header_hex(_INBOX, _REQUEST, _ANSWER)
    return {
        "name": name,
        "topic": kw.get("topic", _INBOX),
        "value": kw.get("value", _ANSWER.decode()),
        "headers": kw.get("headers", [["emarket-answer", good]]),
        "verdict": verdict,
        "reason": reason,
    }


def _answers() -> list[dict[str, Any]]:
    """An answer read from ``topic`` by the sender of ``request`` (``verdict``: ``answer`` to
    believe as the answer to its request, ``refuse`` a message not the market's, ``other`` a
    message the market signed that answers something else)."""
    good = _header_hex(_INBOX, _REQUEST, _ANSWER)
    h = bytes.fromhex(good)
    flipped = (h[:10] + bytes([h[10] ^ 1]) + h[11:]).hex()
    other = _header_hex(_INBOX, b'{"type":"purchase","purchase_id":"p1","other":1}', _ANSWER)
    mallory = _header_hex(_INBOX, _REQUEST, _ANSWER, _key("mallory"))
    bob = _header_hex("t.inbox.bob", _REQUEST, _ANSWER)
    delivery = _header_hex(_INBOX, None, _ANSWER)
    one: list[tuple[str, str, str, str | None]] = [
        ("a null header value", "refuse", "malformed_header", None),
        ("an oversized header (98 bytes: one appended)", "refuse", "malformed_header", good + "00"),
        ("an oversized header (1,025 bytes)", "refuse", "malformed_header", "01" + "00" * 1024),
        ("a truncated header (64 bytes)", "refuse", "malformed_header", good[:128]),
        ("format byte 2", "refuse", "malformed_header", "02" + good[2:]),
        ("a bit of the signature flipped", "refuse", "bad_signature", flipped),
        ("signed by another key", "refuse", "bad_signature", mallory),
        ("signed for another inbox", "refuse", "bad_signature", bob),
        ("the market's answer to other bytes", "other", "other_request", other),
        ("a delivery (65 bytes: bound to no request)", "other", "delivery", delivery),
    ]
    return [
        _answer("the market's answer to the request (a control)", "answer", "ok"),
        _answer("no header", "refuse", "no_header", headers=[]),
        _answer("the header twice", "refuse", "several_headers", headers=[[_HEADER, good]] * 2),
        _answer(
            "the value changed after signing",
            "refuse",
            "bad_signature",
            value='{"type":"rejection","reason":"price_too_high" }',
        ),
        *(_answer(n, v, why, headers=[[_HEADER, hx]]) for n, v, why, hx in one),
    ]


_HEADER = "emarket-answer"


def _outcome() -> dict[str, Any]:
    """The opened outcome of §11.7's first receipt: what a buyer verifies."""
    doc = receipt_vectors.vectors()["receipts"][0]
    r = doc["receipt"]
    outer = ("purchase_id", "buyer_id", "stream_id", "level_before", "level_after")
    return {
        "type": "purchase_fulfilled",
        **{k: r[k] for k in outer},
        "price_minor": r["price_minor"],
        "currency": r["currency"],
        "releases": doc["releases"],
        "opening": doc["opening"],
        "sealed": doc["envelope"],
        "receipt": r,
    }


def _resigned(receipt: dict[str, Any], key: Ed25519PrivateKey, **edit: Any) -> dict[str, Any]:
    from market.receipts import Receipt, sign_receipt  # noqa: PLC0415

    fields = {**{k: v for k, v in receipt.items() if k != "signature"}, **edit}
    rec = Receipt.from_dict(fields)
    return {**fields, "signature": sign_receipt(rec, key)}


def _receipts() -> list[dict[str, Any]]:
    """Opened outcomes a buyer verifies under the market key (``verdict`` valid or refuse)."""
    good = _outcome()
    r = good["receipt"]
    sig = r["signature"]
    flipped = ("B" if sig[0] != "B" else "C") + sig[1:]
    releases = [dict(x) for x in good["releases"]]
    releases[0] = {
        **releases[0],
        "values": [releases[0]["values"][0] + 0.5, *releases[0]["values"][1:]],
    }
    sealed = dict(good["sealed"])
    ct = sealed["ciphertext"]
    sealed["ciphertext"] = ("A" if ct[0] != "A" else "B") + ct[1:]
    cases = [
        ("the market's receipt (a control)", good, "valid", "ok"),
        (
            "a signature of other bytes",
            {**good, "receipt": {**r, "signature": flipped}},
            "refuse",
            "bad_signature",
        ),
        (
            "signed by another key, naming it",
            {**good, "receipt": _resigned(r, _key("mallory"), market_key_id=_kid("mallory"))},
            "refuse",
            "wrong_market_key",
        ),
        (
            "signed by the market's key, naming another key id",
            {**good, "receipt": _resigned(r, _MARKET_KEY, market_key_id="f" * 16)},
            "refuse",
            "wrong_market_key",
        ),
        (
            "a released number that is not the committed one",
            {**good, "releases": releases},
            "refuse",
            "commitment",
        ),
        ("another opening", {**good, "opening": "00" * 32}, "refuse", "commitment"),
        (
            "an outer field edited (price_minor)",
            {**good, "price_minor": r["price_minor"] - 1},
            "refuse",
            "outer_field",
        ),
        (
            "an envelope that is not the one signed",
            {**good, "sealed": sealed},
            "refuse",
            "ciphertext_digest",
        ),
    ]
    return [{"name": n, "outcome": o, "verdict": v, "reason": why} for n, o, v, why in cases]


def _envelopes(rel: dict[str, Any]) -> list[dict[str, Any]]:
    """Releases sealed to the buyer (``rel``: sealing.json's ``release_to_buyer``), opened with
    its key and the purchase's AAD: ``opens`` or ``refuse``."""
    env, key, aad = rel["sealed"], rel["buyer_private_key"], rel["purchase_id"]
    ct = bytearray(base64.b64decode(env["ciphertext"]))
    ct[0] ^= 1
    other = X25519PrivateKey.from_private_bytes(bytes(range(100, 132)))
    cases: list[tuple[str, dict[str, Any], str, str, str]] = [
        ("the envelope (a control)", env, key, aad, "ok"),
        ("a ciphertext bit flipped", {**env, "ciphertext": _b64(bytes(ct))}, key, aad, "tag"),
        ("another purchase's AAD", env, key, "p2", "tag"),
        ("another buyer's key", env, other.private_bytes_raw().hex(), aad, "tag"),
        (
            "an epk of small order (all zero)",
            {**env, "epk": _b64(bytes(32))},
            key,
            aad,
            "small_order",
        ),
        ("a nonce of 11 bytes", {**env, "nonce": _b64(bytes(11))}, key, aad, "malformed"),
        ("another algorithm", {**env, "alg": "x25519-aes-gcm"}, key, aad, "malformed"),
    ]
    return [
        {
            "name": n,
            "envelope": e,
            "private_key": k,
            "aad": a,
            "reason": why,
            "verdict": "opens" if why == "ok" else "refuse",
        }
        for n, e, k, a, why in cases
    ]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _roots() -> list[dict[str, Any]]:
    """§12.1.1's root records a client refuses (a subset of the root vectors)."""
    doc = root_vectors.vectors()
    return [c for c in doc["cases"] if c["verdict"] not in ("trusted", "pinned")]


def negative(release_to_buyer: dict[str, Any]) -> dict[str, Any]:
    """negative.json: every case, as the code makes it (``release_to_buyer``: sealing.json's
    sealed releases, the envelope its cases alter)."""
    market = []
    for build in MARKET_CASES:
        market.extend(build())
    return {
        "market": _MARKET,
        "market_public_key": _b64(_MARKET_KEY.public_key().public_bytes_raw()),
        "noise_secret": _NOISE_SECRET.hex(),
        "answers": {"request": _REQUEST.decode(), "cases": _answers()},
        "receipts": _receipts(),
        "envelopes": _envelopes(release_to_buyer),
        "roots": {"topic": root_vectors.TOPIC, "cases": _roots()},
        "resend": _resend(),
        "market_cases": market,
        "unreached": UNREACHED,
    }


def _resend() -> dict[str, Any]:
    """§12.4's resend rule: which earlier answer in the inbox an ``already_answered`` notice
    stands for (``taken``: an index into ``answers``, or null: none, report the notice)."""
    base = {"purchase_id": "cid-1", "buyer_id": "alice", "stream_id": "temp"}
    pool = [
        {"type": "purchase_fulfilled", **base, "price_minor": 100, "currency": "EUR"},
        {
            "type": "rejection",
            "reason": "idempotency_key_reused",
            "request_id": "cid-1",
            "stream_id": "temp",
        },
        {
            "type": "rejection",
            "reason": "price_too_high",
            "request_id": "cid-1",
            "stream_id": "temp",
        },
        {
            "type": "purchase_fulfilled",
            **base,
            "stream_id": "temp2",
            "price_minor": 100,
            "currency": "EUR",
        },
    ]
    values = [json.dumps(p, separators=(",", ":")) for p in pool]
    digest = [hashlib.sha256(v.encode()).hexdigest() for v in values]
    fulfilled = {"status": "fulfilled", "answer_sha256": digest[0]}
    cases = [
        ("fulfilled, then the id reused with other terms", [0, 1], fulfilled, 0),
        (
            "refused, then the id reused with other terms",
            [2, 1],
            {"status": "rejected", "answer_reason": "price_too_high"},
            0,
        ),
        ("the id also used on another stream", [0, 3, 1], fulfilled, 0),
        ("a market that names neither (made before the rule)", [0, 1], {"status": "fulfilled"}, 0),
        ("neither named, the id also used on another stream", [0, 3], {"status": "fulfilled"}, 0),
        ("the answer named is not in the inbox", [1], fulfilled, None),
    ]
    return {
        "request_id": "cid-1",
        "stream_id": "temp",
        "answers": values,
        "cases": [
            {"name": n, "earlier": e, "details": d, "taken": None if t is None else e[t]}
            for n, e, d, t in cases
        ],
    }
