"""Histogram streams on MarketCore (plain dicts): sparse count maps in, the keys above each
level's threshold out, recomputed from the counts (streams/core/products/histograms.py)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import pytest

from market.histogram_chain import string_key, threshold
from market.receipts import verify_outcome
from streams.core import MarketCore, Stores
from streams.core.codecs import decode_value, encode_value
from streams.core.context import Limits
from streams.wire.events import (
    INBOX_EVENT,
    PurchaseFulfilled,
    QuoteAnswer,
    StreamRegistration,
    ValueReleased,
)
from streams.wire.sealing import open_event
from streams.wire.signing import canonical_bytes
from streams.wire.topics import Topics
from tests.applications.test_histogram import COUNTS, SUPPORT, assert_same_law, run, summaries

from ..helpers import (
    SIGNED_FOR,
    TEST_KEYS,
    assert_registration_refused,
    market_core,
    party,
    purchase,
    quote,
    registration,
    value,
)

T = Topics("t")
WORDS = {
    "product": "histogram",
    "mechanism": "gaussian",
    "steps": [0.5, 2.0],
    "cap": 8.0,
    "dimension": 10,
    "histogram": {"key_space": "strings", "false_keys": 0.01},
}
CITIES = {"berlin": 120.0, "paris": 80.0, "rome": 1.0}


def new_core(**kw: Any) -> MarketCore:
    return market_core("seller1", "alice", "bob", **kw)


def stream(c: MarketCore, sid: str = "h", **kw: Any) -> None:
    out = c.handle(T.registrations, registration(sid, **{**WORDS, **kw}))
    assert out.status == "accepted", out.outputs[0].value[:400]


def publish(c: MarketCore, vid: str, counts: dict[str, float], sid: str = "h") -> Any:
    return c.handle(T.values, value(sid, vid, list(counts.values()), keys=list(counts)))


def inbox(outcome: Any, who: str) -> list[Any]:
    return [INBOX_EVENT.validate_json(o.value) for o in outcome.outputs if o.topic == T.inbox(who)]


def hashed(*words: str) -> list[str]:
    return sorted((str(string_key(w)) for w in words), key=int)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"product": "histogram"}, "needs a histogram spec"),
        ({"histogram": {"key_space": "strings"}}, "needs a histogram spec"),
        ({**WORDS, "mechanism": "laplace"}, "gaussian"),
        ({**WORDS, "sealed": True}, "cannot be sealed"),
        ({**WORDS, "histogram": {"key_space": "integers"}}, "needs a domain_size"),
        ({**WORDS, "histogram": {"key_space": "strings", "domain_size": 9}}, "needs a domain"),
        ({**WORDS, "histogram": {"key_space": "integers", "domain_size": 5}}, "exceeds the domain"),
        ({**WORDS, "histogram": {"key_space": "strings", "false_keys": 1001}}, "less than or"),
        ({**WORDS, "histogram": {"key_space": "strings", "false_keys": 1e-300}}, "greater than"),
        ({**WORDS, "steps": [float(x) for x in range(1, 17)], "cap": 17.0}, "at most 16"),
        ({**WORDS, "steps": [1.0, 1.001], "cap": 2.0}, "1 % apart"),
    ],
)
def test_registrations_that_cannot_be_histograms_are_refused(fields: Any, says: str) -> None:
    assert_registration_refused(new_core(), fields, says)


def test_signatures_bind_the_key_space_and_the_keys() -> None:
    reg = StreamRegistration.model_validate_json(registration("s", **WORDS))
    laxer = reg.model_copy(
        update={
            "histogram": reg.histogram.model_copy(  # type: ignore[union-attr]
                update={"false_keys": 900.0}
            )
        }
    )
    assert canonical_bytes(SIGNED_FOR, reg) != canonical_bytes(SIGNED_FOR, laxer)
    c = new_core(accept_clear_values=True)  # clear keys, to forge them
    stream(c)
    forged = json.loads(value("h", "v", [1.0, 2.0], keys=["a", "b"], clear=True))
    forged["items"][0]["keys"] = ["b", "a"]  # the same counts on other keys
    assert c.handle(T.values, json.dumps(forged).encode()).reason == "bad_signature"


def test_holders_get_the_keys_above_the_threshold_and_purchases_refine_them() -> None:
    c = new_core()
    stream(c)
    assert c.handle(T.purchases, purchase("h", "alice", "a0")).status == "fulfilled"
    out = publish(c, "day1", CITIES)
    assert out.status == "accepted"
    (ev,) = inbox(out, "alice")
    assert isinstance(ev, ValueReleased) and ev.error_model is not None
    tau = threshold(0.5, 1.0, 2**62, 0.01, 3)
    assert ev.error_model.threshold == tau and ev.error_model.std == pytest.approx(1.0)
    (r,) = ev.releases
    # rome's 1 is far below τ ≈ 13; a key with a zero count shows with probability 0.0033
    assert r.keys == hashed("berlin", "paris")
    assert np.allclose(
        r.values, [CITIES["berlin"] if k == hashed("berlin")[0] else 80.0 for k in r.keys], atol=6
    )
    assert all(v > tau for v in r.values)
    bought = inbox(c.handle(T.purchases, purchase("h", "bob", "b0")), "bob")[0]
    assert isinstance(bought, PurchaseFulfilled)
    assert bought.releases == ev.releases  # the same bytes at the same level
    assert bought.receipt.receipt_version == 5
    up = inbox(c.handle(T.purchases, purchase("h", "bob", "b1")), "bob")[0]
    assert isinstance(up, PurchaseFulfilled) and up.level_after == 2.0
    assert up.error_model is not None and up.error_model.threshold == pytest.approx(tau / 2)
    (r2,) = up.releases
    assert r2.keys == r.keys and r2.values != r.values
    pub = c.ctx.keys.public_key
    assert verify_outcome(up.model_dump(), pub).level_after == 2.0
    tampered = up.model_dump()
    tampered["releases"][0]["keys"] = list(reversed(r2.keys or []))
    with pytest.raises(Exception, match="differ"):
        verify_outcome(tampered, pub)
    stripped = up.model_dump()
    del stripped["releases"][0]["keys"]
    with pytest.raises(Exception, match="version 5"):
        verify_outcome(stripped, pub)


def test_quotes_list_each_levels_threshold() -> None:
    c = new_core()
    stream(c)
    (ans,) = inbox(c.handle(T.purchases, quote("h", "alice", "q")), "alice")
    assert isinstance(ans, QuoteAnswer)
    assert [o.threshold for o in ans.offers] == [
        threshold(x, 1.0, 2**62, 0.01, 3) for x in (0.5, 2.0, 8.0)
    ]


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ({"values": [1.0]}, "send each value as `keys`"),
        ({"values": [1.0, 2.0], "keys": ["a"]}, "one count in `values` per key"),
        ({"values": [1.0] * 11, "keys": [str(i) for i in range(11)]}, "takes per value (10"),
        ({"values": [1.0, 2.0], "keys": ["a", "a"]}, "same key"),
        ({"values": [float("nan")], "keys": ["a"]}, "finite"),
    ],
)
def test_malformed_histograms_are_refused_with_a_reason(item: Any, says: str) -> None:
    c = new_core()
    stream(c)
    out = c.handle(T.values, value("h", "v", item["values"], keys=item.get("keys")))
    assert out.reason == "invalid_value"
    (line,) = [json.loads(o.value) for o in out.outputs if o.topic == T.inbox("seller1")]
    assert says in line["outcomes"][0]["message"]


@pytest.mark.parametrize("key", ["400", "007", "-1", "1e3", "٣", " 3"])
def test_integer_keys_are_decimal_digits_inside_the_domain(key: str) -> None:
    c = new_core()
    stream(c, histogram={"key_space": "integers", "domain_size": 400})
    out = c.handle(T.values, value("h", "v", [1.0], keys=[key]))
    assert out.reason == "invalid_value", key
    assert c.handle(T.values, value("h", "w", [1.0], keys=["399"])).status == "accepted"


def test_keys_on_a_stream_of_vectors_are_refused() -> None:
    c = new_core()
    c.handle(T.registrations, registration("vec"))
    assert (
        c.handle(T.values, value("vec", "v", [1.0, 2.0, 3.0], keys=["a", "b", "c"])).reason
        == "invalid_value"
    )


def test_resends_replay_and_conflicts_are_refused_whatever_the_key_order() -> None:
    c = new_core()
    stream(c)
    c.handle(T.purchases, purchase("h", "alice", "a0"))
    first = publish(c, "d", CITIES)
    again = publish(c, "d", dict(reversed(list(CITIES.items()))))
    assert again.status == "duplicate"
    assert inbox(again, "alice")[0].releases == inbox(first, "alice")[0].releases
    assert publish(c, "d", {**CITIES, "rome": 2.0}).reason == "conflicting_value"


def test_a_restarted_market_releases_the_same_histograms() -> None:
    c = new_core()
    stream(c)
    publish(c, "d", CITIES)
    before = inbox(c.handle(T.purchases, purchase("h", "alice", "a0", target_level=2.0)), "alice")
    stored = {k: decode_value(encode_value(v)) for k, v in c.stores.releases.items()}
    again = market_core(
        "seller1",
        "alice",
        "bob",
        stores=Stores(dict(c.stores.streams), stored, {}, dict(c.stores.accounts)),
    )
    after = inbox(again.handle(T.purchases, purchase("h", "bob", "b0", target_level=2.0)), "bob")
    assert after[0].releases == before[0].releases
    assert TEST_KEYS is not None


@pytest.mark.slow
def test_the_services_releases_have_the_dense_algorithms_law() -> None:
    """900 histograms through the market core, bought step by step, against Algorithm 3 run
    on the whole domain with the same levels and thresholds: zero counts released per step,
    their values, the support's values, and zero counts released again at the next step; and
    the noise of the largest count (always shown) at each step against σ² = 1/(2ρ), which the
    mixtures above hardly see (a walk 10 % too wide passed them)."""
    c = new_core(limits=Limits(max_message_bytes=32 << 20))
    levels = (0.5, 1.0, 2.0, 4.0)
    spec = {"key_space": "integers", "domain_size": 400, "false_keys": 40.0}
    stream(c, histogram=spec, steps=list(levels), cap=4.0, dimension=5, retain_last=900)
    items = {str(k): float(n) for k, n in zip(SUPPORT, COUNTS, strict=True)}
    for i in range(900):
        assert publish(c, f"v{i}", items).status == "accepted"
    runs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for i, lvl in enumerate(levels):
        (ev,) = inbox(
            c.handle(T.purchases, purchase("h", "alice", f"p{i}", target_level=lvl)), "alice"
        )
        for r in ev.releases:
            keys = np.array([int(k) for k in r.keys], dtype=np.int64)
            runs.setdefault(r.value_id, []).append((keys, np.asarray(r.values)))
    rounds = [(x, threshold(x, 1.0, 400, 40.0, 4)) for x in levels]
    want = summaries(run("dense", 900, 21, rounds))  # Algorithm 3 over the whole domain
    assert want["n0"].mean() > 5
    assert_same_law(want, summaries(list(runs.values())))
    # per value, the mean over the steps of the largest count's squared standardised noise:
    # 1 in expectation; its spread over values carries the steps' correlation
    z2 = np.array(
        [
            np.mean(
                [
                    (float(v[k == 77][0]) - 12.0) ** 2 * 2 * lvl
                    for (k, v), lvl in zip(steps, levels, strict=True)
                ]
            )
            for steps in runs.values()
        ]
    )
    assert abs(z2.mean() - 1.0) < 4.5 * z2.std() / math.sqrt(z2.size), z2.mean()


def test_a_window_histogram_stream_counts_each_histograms_level_against_its_window() -> None:
    """The same people in every day's histogram: a window's levels add up (ρ, zCDP), and a
    purchase that would overspend the window is refused; a subscription delivery withheld."""
    c = new_core()
    stream(
        c,
        steps=[1.0, 2.0],
        cap=2.0,
        privacy_unit="window",
        window={"duration_ms": 3_600_000, "cap": 3.0},
    )
    assert c.handle(T.purchases, purchase("h", "alice", "a0")).status == "fulfilled"  # ρ = 1
    assert publish(c, "d1", CITIES).status == "accepted"
    assert publish(c, "d2", CITIES).status == "accepted"
    assert c.stores.streams["h"].window_spent_nano == {0: 2 * 10**9}
    out = publish(c, "d3", CITIES)  # 3 in the window: still fits
    assert [type(e).__name__ for e in inbox(out, "alice")] == ["ValueReleased"]
    out = publish(c, "d4", CITIES)  # would be 4 > 3: withheld, and said so
    assert [type(e).__name__ for e in inbox(out, "alice")] == ["DeliveriesWithheld"]
    refused = c.handle(T.purchases, purchase("h", "bob", "b0", target_level=2.0))
    assert refused.reason == "privacy_window_full"


def test_a_receipt_verifies_only_the_one_spelling_of_each_key() -> None:
    from market.errors import ReceiptError
    from market.receipts import release_digest

    good = release_digest([("v", 1.0, [2.0, 3.0], ["5", "18"])])
    assert release_digest([("v", 1.0, [2.0, 3.0], [5, 18])]) == good
    for keys in (["05", "18"], ["٥", "18"], ["5 ", "18"], ["-5", "18"], [True, 18]):
        with pytest.raises(ReceiptError, match="decimal digits"):
            release_digest([("v", 1.0, [2.0, 3.0], keys)])


def test_the_cli_reads_counts_strictly(tmp_path: Any) -> None:
    from streams.clients.histograms import read_counts

    def read(name: str, text: str) -> dict[str, float]:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return read_counts(str(path))

    assert read("a.csv", "\ufeffberlin,3\nparis,4\n") == {"berlin": 3.0, "paris": 4.0}
    assert read("b.csv", "city,visits\nberlin,3\n") == {"berlin": 3.0}
    assert read("c.json", '\ufeff{"berlin": 3}') == {"berlin": 3.0}
    for name, text, says in [
        ("d.json", '{"berlin": 3, "berlin": 4}', "twice"),
        ("e.csv", "berlin,12O\nparis,4\n", "not a number"),
        ("f.csv", "berlin,3\nberlin,4\n", "twice"),
        ("g.json", "{}", "no counts"),
        ("h.csv", "berlin,3\nparis,nan\n", "finite"),
        ("i.csv", "berlin,3\nparis,-3\n", "i.csv row 2: count '-3' is negative"),
        ("j.json", '{"paris": -1}', "j.json key 'paris': count -1 is negative"),
        ("m.csv", "berlin,3\nparis,2.5\n", "m.csv row 2: count '2.5' is not a whole number"),
        ("n.json", '{"paris": 0.5}', "n.json key 'paris': count 0.5 is not a whole number"),
        ("k.json", '[["paris", 3]]', "k.json: a JSON file of counts is one object"),
        ("l.json", " \n paris,3", "l.json: not a JSON object"),  # .json is read as JSON
    ]:
        with pytest.raises(ValueError, match=re.escape(says) if "'" in says else says):
            read(name, text)


def test_a_refused_registration_builds_no_survival_law() -> None:
    c = new_core()
    big = {
        **WORDS,
        "dimension": 50_000,
        "retain_last": 1000,
        "steps": [0.5 * 2**i for i in range(15)],
        "cap": 2**15,
    }
    out = c.handle(T.registrations, registration("big", **big))
    assert out.reason == "stream_too_large" and "big" not in c.streams.cached()


def test_a_sealed_delivery_shows_the_number_of_keys_only_to_a_factor_of_two() -> None:
    """Anyone who reads a buyer's inbox sees envelope sizes: a histogram's are padded to a
    power of two, so 2 keys and 9 keys released look the same."""
    c = market_core("seller1", "sealed_bob")
    stream(c)
    c.handle(T.purchases, purchase("h", "sealed_bob", "b0", target_level=8.0))
    sizes = []
    for n in (2, 9):
        counts = {f"city{i}": 500.0 for i in range(n)}
        (ev,) = inbox(publish(c, f"d{n}", counts), "sealed_bob")
        assert isinstance(ev, ValueReleased) and ev.sealed is not None and not ev.releases
        opened = open_event(ev, party("sealed_bob").sealing_key)  # type: ignore[arg-type]
        assert len(opened.releases[0].keys or []) == n
        sizes.append(len(ev.sealed.ciphertext))
    assert sizes[0] == sizes[1]


def test_huge_counts_reach_buyers_as_numbers() -> None:
    """A count near the largest double is released as it is (its snap is itself), never as
    inf (JSON null, which no buyer could parse, also in a paid purchase)."""
    c = new_core()
    stream(c)
    c.handle(T.purchases, purchase("h", "alice", "a0"))
    (ev,) = inbox(publish(c, "d", {"berlin": 1e300, "paris": 1e298, "rome": 80.0}), "alice")
    assert isinstance(ev, ValueReleased) and 1e300 in ev.releases[0].values
    (bought,) = inbox(c.handle(T.purchases, purchase("h", "bob", "b0")), "bob")
    assert isinstance(bought, PurchaseFulfilled) and bought.releases == ev.releases


def test_new_noise_counts_new_levels_and_a_resend_adds_none() -> None:
    """``emarket_noise_draws_total`` counts levels released for the first time; a histogram is
    recomputed on every request, but a resend or a level already released is not new."""
    c = new_core()
    stream(c)
    c.handle(T.purchases, purchase("h", "alice", "a0"))
    assert publish(c, "d", CITIES).new_noise == 1
    assert publish(c, "d", CITIES).new_noise == 0  # a resend: the same bytes, nothing new
    assert c.handle(T.purchases, purchase("h", "bob", "b0")).new_noise == 0  # held level
    assert c.handle(T.purchases, purchase("h", "bob", "b1")).new_noise == 1  # a level up
    assert c.handle(T.purchases, purchase("h", "alice", "a1")).new_noise == 0  # bob's level
