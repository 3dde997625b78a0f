"""One meaning per signed byte string (issue #29): price tables with one key per level, integers
read the same in every language, and key rotations that say what happened and never revive old
signed bytes."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from streams.clients.keys import Party
from streams.core import MarketCore
from streams.wire.events import (
    INBOX_EVENT,
    OpenAccount,
    PurchaseRequest,
    Rejection,
    TableSpec,
    ValueItem,
)
from streams.wire.signing import MarketRef, canonical_bytes, sign, signed, verify
from streams.wire.topics import Topics

from ..helpers import MARKET, SIGNED_FOR, market_core, party, purchase, registration, value

T = Topics(MARKET)


# --------------------------------------------------------------- one key per price level
@pytest.mark.parametrize(
    ("prices", "level"),
    [
        ({"1": 100, "1.0": 1}, 1.0),
        ({"1.0": 1, "1": 100}, 1.0),
        ({"0.5": 5, "5e-1": 7}, 0.5),
        ({"1": 3, "1.000000000000000001": 4}, 1.0),
    ],
)
def test_a_price_table_pricing_one_level_twice_is_refused(
    prices: dict[str, int], level: float
) -> None:
    """Two spellings of one level would leave its price to the unsigned order of JSON keys."""
    c = market_core("seller1")
    raw = registration("s", steps=[level], cap=level, pricing={"kind": "table", "prices": prices})
    out = c.handle(T.registrations, raw)
    assert (out.status, out.reason) == ("rejected", "duplicate_price_level")
    body = Rejection.model_validate_json(out.outputs[0].value)
    assert "twice" in body.message and "once" in body.message
    with pytest.raises(ValidationError, match="twice"):
        TableSpec.model_validate({"prices": prices})


def test_a_price_table_with_one_key_per_level_is_accepted() -> None:
    c = market_core("seller1")
    raw = registration(
        "s", steps=[0.5, 1.0], cap=1.0, pricing={"kind": "table", "prices": {"5e-1": 10, "1.0": 20}}
    )
    assert c.handle(T.registrations, raw).status == "accepted"


# ------------------------------------------------------------------- integers beyond 2**53
@pytest.mark.parametrize(
    "spelling",
    ["9007199254740993", "9007199254740992.0", "9.007199254740992e15", "-9007199254740992"],
)
def test_a_count_whose_double_is_not_a_safe_integer_is_refused_however_spelled(
    spelling: str,
) -> None:
    """The signature covers the double 2**53, which 2**53 + 1 also reads as: on a counts stream
    both spellings are refused, as the signed bytes alone decide; a real-valued stream takes
    the double whatever the spelling. (Clear values: the JSON text is the point; sealed numbers
    are parsed by the same model once opened.)"""
    c = market_core("seller1", accept_clear_values=True)
    c.handle(
        T.registrations,
        registration("n", mechanism="discrete_laplace", dimension=1, steps=[1.0], cap=1.0),
    )
    c.handle(
        T.registrations, registration("r", dimension=1, sensitivity=1024.0, steps=[1.0], cap=1.0)
    )  # a grid of 2^-2: it holds 2^53
    sign = -1.0 if spelling.startswith("-") else 1.0
    for sid, status in (("n", "rejected"), ("r", "accepted")):
        raw = value(sid, "x", [sign * 2.0**53], clear=True)
        raw = raw.replace(b"%.1f" % (sign * 2.0**53), spelling.encode())
        assert spelling.encode() in raw
        out = c.handle(T.values, raw)
        assert out.status == status, out.outputs[0].value[:300]
        if status == "rejected":  # a count is never negative: that is refused first
            assert out.items[0][1] == ("invalid_count" if sign < 0 else "invalid_value")
    safe = value("n", "y", [2.0**53 - 1.0])
    assert c.handle(T.values, safe).status == "accepted"


@pytest.mark.parametrize(
    "spelling",
    ["9007199254740993", "9007199254740992.0", "9.007199254740992e15", "9007199254740992"],
)
def test_a_signed_integer_field_beyond_2_to_the_53_is_refused_however_spelled(
    spelling: str,
) -> None:
    """Every integer a party signs (times, prices, sizes) is at most 2**53 - 1 in magnitude:
    beyond, a JSON reader with doubles and one with integers read different numbers."""
    body: dict[str, Any] = {
        "purchase_id": "p",
        "buyer_id": "b",
        "stream_id": "s",
        "max_price_minor": 1,
        "requested_at_ms": 1,
        "key_id": "0" * 16,
        "signature": "A" * 86 + "==",
    }
    text = json.dumps(body).replace('"requested_at_ms": 1', f'"requested_at_ms": {spelling}')
    with pytest.raises(ValidationError, match="2\\*\\*53"):
        PurchaseRequest.model_validate_json(text)
    ok = json.dumps(body).replace('"requested_at_ms": 1', '"requested_at_ms": 9007199254740991')
    assert PurchaseRequest.model_validate_json(ok).requested_at_ms == 2**53 - 1
    assert (
        PurchaseRequest.model_validate_json(ok.replace("991", "991.0")).requested_at_ms == 2**53 - 1
    )
    with pytest.raises(ValidationError):
        ValueItem.model_validate_json(
            f'{{"value_id": "x", "values": [1], "published_at_ms": {spelling}}}'
        )


# ------------------------------------------------------------------------------ key rotation
def _rotate(c: MarketCore, old: Party, new: Party, version: int) -> None:
    rot = Party("alice", old.signing_key, key_version=version - 1).rotate_to(
        new, SIGNED_FOR, version, rotated_at_ms=2_000
    )
    out = c.handle(T.accounts, rot.model_dump_json().encode())
    assert out.status == "accepted", out.outputs[0].value[:300]


def _stream(c: MarketCore) -> None:
    assert c.handle(T.registrations, registration("temp")).status == "accepted"
    assert c.handle(T.values, value("temp", "v1", [1.0, 2.0, 3.0])).status == "accepted"


def test_a_purchase_signed_with_a_rotated_key_is_refused_to_its_sender() -> None:
    """In flight while the buyer rotated: refused with ``key_rotated``, in the buyer's inbox,
    saying what happened and what to do."""
    c = market_core("seller1", "alice")
    _stream(c)
    in_flight = purchase("temp", "alice", "p1")
    _rotate(c, party("alice"), party("alice-2"), 2)
    out = c.handle(T.purchases, in_flight)
    assert (out.status, out.reason) == ("rejected", "key_rotated")
    inbox = [o for o in out.outputs if o.topic == T.inbox("alice")]
    assert len(inbox) == 1
    rej = INBOX_EVENT.validate_json(inbox[0].value)
    assert isinstance(rej, Rejection) and rej.sender_id == "alice"
    assert "version 2" in rej.message and "sign" in rej.message and "again" in rej.message
    # signed anew with the current key (version 2) it is fulfilled
    new = Party("alice", party("alice-2").signing_key, key_version=2)
    again = new.sign(
        PurchaseRequest,
        SIGNED_FOR,
        purchase_id="p1b",
        buyer_id="alice",
        stream_id="temp",
        max_price_minor=10**6,
        requested_at_ms=1_000,
    )
    assert c.handle(T.purchases, again.model_dump_json().encode()).status == "fulfilled"


def test_key_rotated_says_when_in_utc_and_keeps_the_milliseconds_for_machines() -> None:
    """The refusal said "since 1733… (Unix ms)": a person reads an ISO 8601 UTC time, and the
    number stays in ``details`` for machines."""
    c = market_core("seller1", "alice")
    _stream(c)
    in_flight = purchase("temp", "alice", "p1")
    _rotate(c, party("alice"), party("alice-2"), 2)
    out = c.handle(T.purchases, in_flight)
    rej = INBOX_EVENT.validate_json(
        next(o.value for o in out.outputs if o.topic == T.inbox("alice"))
    )
    assert isinstance(rej, Rejection) and rej.reason == "key_rotated"
    assert "Unix ms" not in rej.message
    when = re.search(r"since (\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d{3})?Z\.", rej.message)
    assert when is not None, rej.message
    stamp = rej.details.get("rotated_at_ms")
    assert isinstance(stamp, int) and str(stamp) not in rej.message
    said = datetime(*map(int, when.groups()[:6]), tzinfo=UTC)
    assert said == datetime.fromtimestamp(stamp // 1000, tz=UTC)


def test_old_signed_bytes_are_never_fulfilled_after_rotating_back_to_their_key() -> None:
    """Back on the first key at version 3, the bytes it signed at version 1 no longer verify;
    what it signs at version 3 does."""
    c = market_core("seller1", "alice")
    _stream(c)
    old = purchase("temp", "alice", "p-old")
    _rotate(c, party("alice"), party("alice-2"), 2)
    assert c.handle(T.purchases, old).reason == "key_rotated"
    _rotate(c, party("alice-2"), party("alice"), 3)
    out = c.handle(T.purchases, old)
    assert out.status == "rejected", "old signed bytes were fulfilled after a rotation back"
    assert out.reason == "key_rotated"
    again = Party("alice", party("alice").signing_key, key_version=3).sign(
        PurchaseRequest,
        SIGNED_FOR,
        purchase_id="p-new",
        buyer_id="alice",
        stream_id="temp",
        max_price_minor=10**6,
        requested_at_ms=1_000,
    )
    assert c.handle(T.purchases, again.model_dump_json().encode()).status == "fulfilled"


def test_the_signing_vectors_of_the_protocol() -> None:
    """docs/protocol.md §2.4: the canonical bytes and signatures of one purchase at key versions
    1 and 3 for the market ``t`` of key id ``56475aa75463474c``; a signature verifies at its own
    version only, for its own market only, and the same event signed with the first version's
    bytes (no market key id) verifies nowhere."""
    text = (Path(__file__).parents[3] / "docs" / "protocol.md").read_text()
    table = text.split("<!-- signing vectors: begin -->")[1].split("<!-- signing vectors: end")[0]
    rows = re.findall(r"^\| (\d+) \| `([0-9a-f]+)` \| `([A-Za-z0-9+/=]+)` \|$", table, re.M)
    assert [r[0] for r in rows] == ["1", "3"]
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    market = MarketRef("t", "56475aa75463474c")
    event = signed(
        PurchaseRequest,
        market,
        key,
        purchase_id="p1",
        buyer_id="alice",
        stream_id="temp",
        max_price_minor=100,
        requested_at_ms=1000,
    )
    public = "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="
    other = MarketRef("t", "0123456789abcdef")  # same prefix, another market key
    for version, data, signature in rows:
        g = int(version)
        assert canonical_bytes(market, event, g).hex() == data
        assert data.startswith(b"emarket-sig-v2\x00".hex())
        assert sign(market, event, key, generation=g) == signature
        assert verify(market, event, public, signature, generation=g)
        assert not verify(market, event, public, signature, generation={1: 3, 3: 1}[g])
        assert not verify(other, event, public, signature, generation=g)


def test_a_key_file_keeps_its_key_version(tmp_path: Path) -> None:
    """What a party signs after a rotation carries the version its key file records."""
    path = tmp_path / "alice.key"
    Party.generate("alice").save(path)
    assert Party.load(path).key_version == 1
    rotated = Party.load(path)
    dataclasses.replace(rotated, key_version=3).save_over(path)
    again = Party.load(path)
    assert again.key_version == 3 and again.public_key == rotated.public_key
    ev = again.sign(
        PurchaseRequest,
        SIGNED_FOR,
        purchase_id="p",
        buyer_id="alice",
        stream_id="s",
        max_price_minor=1,
        requested_at_ms=1,
    )
    assert verify(SIGNED_FOR, ev, again.public_key, generation=3)
    assert not verify(SIGNED_FOR, ev, again.public_key)


def _signed_v1(model: Any, signer: Party, **fields: Any) -> bytes:
    """``fields`` signed as a client of protocol v1 signs: the bytes of §2 without the market
    key id, under the head ``emarket-sig-v1``."""
    draft = signer.sign(model, SIGNED_FOR, **fields)
    data = canonical_bytes(SIGNED_FOR, draft)
    head = b"emarket-sig-v2\x00" + b"s\x00\x00\x00\x01" + MARKET.encode()
    key_id = b"s\x00\x00\x00\x10" + SIGNED_FOR.key_id.encode()
    assert data.startswith(head + key_id)
    v1 = b"emarket-sig-v1\x00" + b"s\x00\x00\x00\x01" + MARKET.encode() + data[len(head + key_id) :]
    signature = base64.b64encode(signer.signing_key.sign(v1)).decode()
    return draft.model_copy(update={"signature": signature}).model_dump_json().encode()


def test_events_signed_with_protocol_v1_are_refused_with_what_to_do() -> None:
    """Bytes of the first version name no market key: an opening and a purchase signed that
    way are never applied, and the refusal says why (``old_signature_format``) and what to do;
    the purchase's refusal reaches its account's inbox."""
    c = market_core("seller1", "alice")
    _stream(c)
    opening = _signed_v1(
        OpenAccount,
        party("bob"),
        account_id="bob",
        signing_key=party("bob").public_key,
        opened_at_ms=1_000,
    )
    out = c.handle(T.accounts, opening)
    assert (out.status, out.reason) == ("rejected", "old_signature_format")
    assert c.ctx.directory.get("bob") is None
    buy = _signed_v1(
        PurchaseRequest,
        party("alice"),
        purchase_id="p1",
        buyer_id="alice",
        stream_id="temp",
        max_price_minor=10**6,
        requested_at_ms=1_000,
    )
    out = c.handle(T.purchases, buy)
    assert (out.status, out.reason) == ("rejected", "old_signature_format")
    [inbox] = [o for o in out.outputs if o.topic == T.inbox("alice")]
    rej = INBOX_EVENT.validate_json(inbox.value)
    assert isinstance(rej, Rejection) and "Update the client" in rej.message
