"""A seller sees its sales (issue #31 point 8): one signed ``sale`` in its inbox per purchase
fulfilled on its streams, never for a refusal or a resend, the same bytes again only when a lost
batch is replayed; the format follows from docs/protocol.md §8.4 and its vectors alone; the CLI's
``sales`` shows what was bought, by whom (a pseudonym) and for how much.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from market.receipts import Receipt
from streams.core import MarketCore, Stores
from streams.core.context import Limits
from streams.core.outputs import Outcome, Output
from streams.core.replay.records import ANSWER_INTERVAL_MS
from streams.wire.answers import verify_answer
from streams.wire.events import INBOX_EVENT, PurchaseFulfilled, Sale, Sales
from streams.wire.sales import (
    SALE_BYTES,
    SALE_ITEM_BYTES,
    SALES_BYTES,
    buyer_ref,
    sale_of,
    sales_of,
)
from streams.wire.topics import Topics

from ..conftest import Market
from ..helpers import TEST_KEYS, cli_parties, open_accounts, purchase, registration, value

ROOT = Path(__file__).resolve().parents[3]
T = Topics("t")
PUB = TEST_KEYS.signing_key.public_key()


def new_core(now: list[int], stores: Stores | None = None) -> MarketCore:
    core = MarketCore(stores or Stores(), TEST_KEYS, T, clock=lambda: now[0], limits=Limits())
    open_accounts(core, "seller1", "seller2", "alice", "bob")
    return core


def notices(outputs: list[Output], seller: str = "seller1") -> list[Sales]:
    """The sale notices among ``outputs`` to ``seller``'s inbox, each checked as the market
    signs them: for that inbox alone (it answers no request of the seller's), keyed by the
    digest of the first receipt it lists."""
    found = []
    for o in outputs:
        if o.topic != T.inbox(seller):
            continue
        assert verify_answer(PUB, T.prefix, o.topic, o.value, list(o.headers)) is None
        ev = INBOX_EVENT.validate_json(o.value)
        assert isinstance(ev, Sales) and o.key == ev.sales[0].receipt_sha256.encode()
        assert ev.seller_id == seller
        found.append(ev)
    return found


def sales_in(out: Outcome, seller: str = "seller1") -> list[Sale]:
    """The sales ``out`` tells ``seller`` (outside a batch: one notice per sale)."""
    found = [s for n in notices(out.outputs, seller) for s in n.each()]
    assert len(found) == len(notices(out.outputs, seller))
    return found


def _fulfilled(out: Outcome) -> PurchaseFulfilled:
    ev = INBOX_EVENT.validate_json(out.outputs[0].value)
    assert isinstance(ev, PurchaseFulfilled), out.reason
    return ev


# -- the core ----------------------------------------------------------------------------------
def test_a_fulfilled_purchase_tells_its_seller_once_and_a_refusal_never() -> None:
    now = [5_000]
    core = new_core(now)
    core.handle(T.registrations, registration("temp"))
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    core.handle(T.values, value("temp", "v1", [1.0, 2.0, 3.0]))
    out = core.handle(T.purchases, purchase("temp", "alice", "p1", target_level=1.0))
    bought = _fulfilled(out)
    (sale,) = sales_in(out)
    assert len(out.outputs) == 2  # the buyer's outcome, the seller's notice: nothing else
    assert (sale.seller_id, sale.stream_id, sale.level_unit) == ("seller1", "temp", "epsilon")
    assert (sale.level_before, sale.level_after, sale.price_minor, sale.currency) == (
        0.0,
        1.0,
        100,
        "EUR",
    )
    assert (sale.value_count, sale.requested_at_ms, sale.sold_at_ms) == (2, 1_000, 5_000)
    receipt = Receipt.from_dict(bought.receipt.model_dump())
    assert sale.receipt_sha256 == hashlib.sha256(receipt.canonical_bytes()).hexdigest()
    assert sale.buyer_ref == buyer_ref(TEST_KEYS.pseudonym_key, "seller1", "alice")
    raw = out.outputs[1].value
    assert b"alice" not in raw and b"p1" not in raw  # no account id, no id the buyer chose
    # refused: over the price, nothing more to buy, an id reused, an unknown stream
    for refused in (
        purchase("temp", "bob", "p2", max_price=10, target_level=2.0),
        purchase("temp", "alice", "p3", target_level=0.5),
        purchase("temp", "alice", "p1", target_level=2.0),
        purchase("nope", "alice", "p4"),
    ):
        got = core.handle(T.purchases, refused)
        assert got.status == "rejected" and not sales_in(got), got.reason
    assert core.stores.streams["temp"].revenue_minor == 100


def test_a_resend_answered_from_the_record_is_no_new_sale() -> None:
    now = [5_000]
    core = new_core(now)
    core.handle(T.registrations, registration("temp"))
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    first = core.handle(T.purchases, purchase("temp", "alice", "p1"))
    assert len(sales_in(first)) == 1
    kept = core.handle(T.purchases, purchase("temp", "alice", "p1"))  # its outcome is in the inbox
    assert kept.reason == "already_answered" and not kept.outputs
    now[0] += ANSWER_INTERVAL_MS
    core.ctx.records.inboxes_remade([T.inbox("alice")])  # the inbox lost: answered again
    first_again = core.handle(T.purchases, purchase("temp", "alice", "p1"))
    assert first_again.outputs[0].value == first.outputs[0].value and not sales_in(first_again)
    soon = core.handle(T.purchases, purchase("temp", "alice", "p1", requested_at_ms=5_001))
    assert soon.reason == "already_answered" and not sales_in(soon)  # within the interval
    now[0] += ANSWER_INTERVAL_MS
    again = core.handle(T.purchases, purchase("temp", "alice", "p1", requested_at_ms=5_002))
    assert again.status == "duplicate" and again.outputs[0].value == first.outputs[0].value
    assert not sales_in(again)
    assert core.stores.streams["temp"].revenue_minor == 50


def test_a_lost_batch_replayed_sends_the_same_sale_and_a_later_resend_none() -> None:
    """A worker dies after the batch's state is durable, before its outputs are sent: the
    replay sends the outcome and the sale again, byte for byte (readers count it once); once
    those outputs are sent, a resend reports no sale."""
    now = [5_000]
    stores = Stores()
    core = new_core(now, stores)
    core.handle(T.registrations, registration("temp", retain_last=1))
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    with core.batch() as told:
        first = core.handle(T.purchases, purchase("temp", "alice", "p"))
        core.handle(T.values, value("temp", "v1", [1.0, 2.0, 3.0]))  # evicts v0
    now[0] += 2 * ANSWER_INTERVAL_MS
    restarted = new_core(now, stores)  # the outputs were never sent
    with restarted.batch() as told_again:
        again = restarted.handle(T.purchases, purchase("temp", "alice", "p"))
        restarted.handle(T.values, value("temp", "v1", [1.0, 2.0, 3.0]))
    assert again.status == "duplicate"
    assert [(o.key, o.value) for o in again.outputs] == [(o.key, o.value) for o in first.outputs]
    (notice,) = notices(told_again)
    assert [(o.key, o.value) for o in told_again] == [(o.key, o.value) for o in told]
    assert len(notice.sales) == 1 and notice.sales[0].sold_at_ms == 5_000
    with restarted.batch():  # the replay's outputs were sent
        restarted.handle(T.values, value("temp", "v2", [1.0, 2.0, 3.0]))
    now[0] += 2 * ANSWER_INTERVAL_MS
    later = restarted.handle(T.purchases, purchase("temp", "alice", "p"))
    assert later.status == "duplicate" and not sales_in(later)
    assert stores.streams["temp"].revenue_minor == 50


def test_a_batch_committed_without_its_outputs_recomputes_them_and_tells_the_sale_again() -> None:
    """The record was written without the outcome's bytes (nothing in its batch evicted what it
    covered): the worker that takes over recomputes the very outcome, tells the same sale again,
    and a copy after that adds nothing."""
    now = [5_000]
    stores = Stores()
    core = new_core(now, stores)
    core.handle(T.registrations, registration("temp"))
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    raw = purchase("temp", "alice", "p")
    with core.batch() as told:
        first = core.handle(T.purchases, raw)
    assert stores.purchases["alice/temp/p"].payload is None  # written once, without the bytes
    now[0] -= 5_000  # the worker that takes the partition over: its clock 5 s behind
    restarted = new_core(now, stores)  # the outputs were never sent
    with restarted.batch() as told_again:
        again = restarted.handle(T.purchases, raw)
    assert again.status == "duplicate"
    assert [o.value for o in again.outputs] == [o.value for o in first.outputs]
    assert [o.value for o in told_again] == [o.value for o in told]
    assert len(notices(told_again)) == 1
    with restarted.batch() as told_later:
        later = restarted.handle(T.purchases, raw)
    assert later.reason == "already_answered" and not later.outputs and not told_later
    assert stores.streams["temp"].revenue_minor == 50


def test_a_buyer_has_one_pseudonym_per_seller() -> None:
    now = [5_000]
    core = new_core(now)
    core.handle(T.registrations, registration("s1"))
    core.handle(T.registrations, registration("s2"))
    core.handle(T.registrations, registration("s3", seller_id="seller2"))
    refs: dict[tuple[str, str], str] = {}
    for stream, seller in (("s1", "seller1"), ("s2", "seller1"), ("s3", "seller2")):
        core.handle(T.values, value(stream, "v0", [1.0, 2.0, 3.0], seller_id=seller))
        for buyer in ("alice", "bob"):
            (sale,) = sales_in(core.handle(T.purchases, purchase(stream, buyer, "p")), seller)
            refs[stream, buyer] = sale.buyer_ref
    assert refs["s1", "alice"] == refs["s2", "alice"] != refs["s1", "bob"] == refs["s2", "bob"]
    assert refs["s3", "alice"] not in (refs["s1", "alice"], refs["s1", "bob"])


def _longest(i: int) -> Sale:
    """A sale with the longest ids, the largest price, levels with every digit and times."""
    receipt = Receipt(
        purchase_id=f"{i:p>64}",
        buyer_id="b" * 64,
        stream_id="s" * 64,
        seller_id="x" * 64,
        mechanism="discrete_laplace",
        value_ids=("v" * 64,) * 1000,
        level_before=1.2345678901234567e-300,
        level_after=-1.2345678901234567e300,
        price_minor=10**15,
        currency="KWD",
        requested_at_ms=2**53 - 1,
        market_key_id="0" * 16,
        commitment="ab" * 32,
        ciphertext_digest="cd" * 32,
    )
    return sale_of(receipt, b"k" * 32, 2**53 - 1)


def test_a_sales_notice_lists_at_most_64_within_its_bound() -> None:
    """A batch's 130 sales of one seller (one of them told twice) and one of another: three
    notices to the first (64, 64, 1), one to the other, each sale listed once; the longest
    notice within the bound, header and key included."""
    sold = [_longest(i) for i in range(129)]
    other = sold[0].model_copy(update={"seller_id": "y"})
    notices = sales_of([*sold[:3], other, sold[1], *sold[3:]])
    assert [(n.seller_id, len(n.sales)) for n in notices] == [
        ("x" * 64, 64),
        ("x" * 64, 64),
        ("x" * 64, 1),
        ("y", 1),
    ]
    listed = [s.receipt_sha256 for n in notices[:3] for s in n.sales]
    assert listed == [s.receipt_sha256 for s in sold]
    assert notices[0].each()[5] == sold[5]
    raw = notices[0].model_dump_json().encode()
    header = 65  # u8 ‖ signature: a notice answers no request
    assert 64 + len(raw) + len("emarket-answer") + header <= SALES_BYTES
    one = sold[0].model_dump_json().encode()
    assert 64 + len(one) + len("emarket-answer") + header <= SALE_BYTES  # an earlier market's
    assert len(raw) - len(notices[2].model_dump_json()) <= 63 * SALE_ITEM_BYTES


def test_a_batch_tells_each_seller_its_sales_in_one_notice() -> None:
    """Purchases on two sellers' streams in one batch: one notice each, listing its sales in
    the order they were decided; none in the purchases' own outputs."""
    now = [5_000]
    core = new_core(now)
    for sid, seller in (("s1", "seller1"), ("s2", "seller1"), ("s3", "seller2")):
        core.handle(T.registrations, registration(sid, seller_id=seller))
        core.handle(T.values, value(sid, "v0", [1.0, 2.0, 3.0], seller_id=seller))
    with core.batch() as told:
        outs = [
            core.handle(T.purchases, purchase(sid, buyer, "p"))
            for sid in ("s1", "s3", "s2")
            for buyer in ("alice", "bob")
        ]
    assert all(len(o.outputs) == 1 for o in outs)  # each buyer's answer alone
    digests = [_digest(_fulfilled(o)) for o in outs]
    (first,) = notices(told, "seller1")
    (second,) = notices(told, "seller2")
    assert [s.receipt_sha256 for s in first.sales] == digests[:2] + digests[4:]
    assert [s.receipt_sha256 for s in second.sales] == digests[2:4]
    assert [s.stream_id for s in first.sales] == ["s1", "s1", "s2", "s2"]


def _digest(bought: PurchaseFulfilled) -> str:
    return hashlib.sha256(
        Receipt.from_dict(bought.receipt.model_dump()).canonical_bytes()
    ).hexdigest()


# -- the wire: docs/protocol.md §8.4 and docs/vectors/sales.json ---------------------------------
def _s(text: str) -> bytes:
    return b"s" + struct.pack(">I", len(text.encode())) + text.encode()


def _ref(key: bytes, seller: str, buyer: str) -> str:
    return hmac.digest(key, _s(seller) + _s(buyer), "sha256")[:16].hex()


def _one_sale_follows(
    sale: dict[str, object], receipt: dict[str, object], ref: str, digest: str
) -> None:
    """A sale's members, as §8.4 derives them from its receipt."""
    assert (sale["buyer_ref"], sale["receipt_sha256"]) == (ref, digest)
    for name in (
        "stream_id",
        "level_before",
        "level_after",
        "price_minor",
        "currency",
        "requested_at_ms",
    ):
        assert sale[name] == receipt[name], name
    assert sale["value_count"] == len(receipt["value_ids"])  # type: ignore[arg-type]


def test_the_sale_vector_follows_from_the_text_alone() -> None:
    doc = json.loads((ROOT / "docs" / "vectors" / "sales.json").read_text())
    secret = bytes.fromhex(doc["noise_secret"])
    key = hmac.digest(secret, b"emarket buyer pseudonym key v1", "sha256")
    assert key.hex() == doc["pseudonym_key"] and bytes.fromhex(doc["pseudonym_label"]) == (
        b"emarket buyer pseudonym key v1"
    )
    ids = _s(doc["seller_id"]) + _s(doc["buyer_id"])
    assert ids.hex() == doc["pseudonym_message"]
    assert _ref(key, doc["seller_id"], doc["buyer_id"]) == doc["buyer_ref"]
    market = Ed25519PublicKey.from_public_bytes(base64.b64decode(doc["market_public_key"]))
    sold = [doc, doc["second"]]
    for one in sold:
        signed_receipt = bytes.fromhex(one["receipt_canonical_bytes"])
        assert hashlib.sha256(signed_receipt).hexdigest() == one["receipt_sha256"]
        market.verify(base64.b64decode(one["receipt"]["signature"]), signed_receipt)
        assert _ref(key, doc["seller_id"], one["receipt"]["buyer_id"]) == one["buyer_ref"]
    assert doc["key"] == doc["receipt_sha256"]  # the first sale listed names the record
    value = doc["value"].encode()
    signed = (
        b"emarket-sig-v1\x00"
        + _s(doc["market"])
        + _s("answer")
        + _s(doc["topic"])
        + b"n"
        + _s(hashlib.sha256(value).hexdigest())
    )
    assert signed.hex() == doc["signed_bytes"]
    head = bytes.fromhex(doc["header"])
    assert len(head) == 65 and head[0] == 1
    market.verify(head[1:], signed)
    notice = json.loads(value)
    assert (notice["type"], notice["seller_id"], len(notice["sales"])) == ("sales", "seller1", 2)
    for sale, one in zip(notice["sales"], sold, strict=True):
        _one_sale_follows(sale, one["receipt"], one["buyer_ref"], one["receipt_sha256"])
    schema = json.loads((ROOT / "docs" / "schemas" / "inbox.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(notice)
    assert Sales.model_validate_json(value).model_dump_json().encode() == value
    old = json.loads(doc["one_sale_value"])  # a one-sale message of an earlier market
    assert (old["type"], old["seller_id"]) == ("sale", "seller1")
    _one_sale_follows(old, doc["receipt"], doc["buyer_ref"], doc["receipt_sha256"])
    jsonschema.Draft202012Validator(schema).validate(old)
    assert Sale.model_validate_json(doc["one_sale_value"]) == Sales.model_validate(notice).each()[0]


# -- on the broker, through the CLI ------------------------------------------------------------
def _cli(market: Market, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    return subprocess.run(
        [sys.executable, "-m", "streams", *pre, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.broker
def test_sales_shows_what_buy_bought(market: Market, tmp_path: Path) -> None:
    market.start_worker()
    keys = cli_parties(lambda *a: _cli(market, *a), [], tmp_path, "acme", "alice")
    acme, alice = keys["acme"], keys["alice"]
    empty = _cli(market, "sales", *acme)
    assert empty.returncode == 0 and "no sales yet" in empty.stdout, empty.stderr
    for stream in ("temp", "wind"):
        reg = _cli(
            market,
            "register",
            *acme,
            "--stream",
            stream,
            "--dimension",
            "2",
            "--steps",
            "0.5,1,2",
            "--price-per-level",
            "1.00",
        )
        assert reg.returncode == 0, reg.stderr
        pub = _cli(market, "publish", *acme, "--stream", stream, "--values", "1,2")
        assert pub.returncode == 0, pub.stderr
    for stream, target in (("temp", "0.5"), ("temp", "2"), ("wind", "1")):
        got = _cli(
            market, "buy", *alice, "--stream", stream, "--target", target, "--max-price", "5"
        )
        assert got.returncode == 0, got.stderr
    human = _cli(market, "sales", *acme)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    rows = [x for x in lines if x.startswith(("temp ", "wind "))]
    assert len(rows) == 3, human.stdout
    assert "0 -> 0.5 epsilon" in rows[0] and "0.50 EUR" in rows[0], human.stdout
    assert "0.5 -> 2 epsilon" in rows[1] and "1.50 EUR" in rows[1], human.stdout
    assert any(x.startswith("total temp") and "2.00 EUR" in x and "2 sales" in x for x in lines)
    assert any(x.startswith("total wind") and "1.00 EUR" in x for x in lines), human.stdout
    assert any(x.startswith("total") and "3.00 EUR" in x and "3 sales" in x for x in lines)
    buyers = {x.split()[1] for x in rows}
    assert len(buyers) == 1 and "alice" not in human.stdout  # one buyer, by its pseudonym
    machine = _cli(market, "sales", *acme, "--stream", "temp", "--json")
    assert machine.returncode == 0, machine.stderr
    sold = json.loads(machine.stdout)
    assert [s["price_minor"] for s in sold["sales"]] == [50, 150]
    assert sold["totals"] == {"temp": {"EUR": {"sales": 2, "price_minor": 200}}}
    assert all(Sale.model_validate(s) for s in sold["sales"])
    buyer_view = _cli(market, "sales", *alice)  # a buyer's inbox holds none of its own
    assert buyer_view.returncode == 0 and "no sales yet" in buyer_view.stdout
    _follow(market, acme)


def _follow(market: Market, acme: list[str]) -> None:
    """``sales --follow`` prints each sale as it reads it, and the totals at Ctrl-C."""
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streams", *pre, "sales", *acme, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        rows = [proc.stdout.readline() for _ in range(4)]  # the header, then the three sales
        assert rows[0].startswith("stream") and all(
            r.startswith(("temp", "wind")) for r in rows[1:]
        ), rows
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert re.search(r"^total\s+3 sales\s+3\.00 EUR$", out, re.M), out
