"""Receipts as the market issues them: the opening reaches the buyer only, envelopes are padded.

Built by :class:`MarketCore` with the test market key (no broker): what a stranger sees on a
buyer's inbox (a sealed outcome: receipt, commitment, ciphertext) says nothing of the numbers,
neither through the receipt nor through the envelope's length; the buyer, who opens the
envelope, holds the opening and verifies, also after a JSON tool re-spelled the file
(``verify-receipt`` run as a person would).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market.envelope import Sealer, public_key_b64
from market.receipts import commitment, release_digest, verify_outcome
from streams.core import MarketCore
from streams.wire.events import INBOX_EVENT, PurchaseFulfilled, ReleasedValue, ValueReleased
from streams.wire.sealing import NUMBER_WIDTH, open_event, releases_json, seal_releases
from streams.wire.topics import Topics

from ...market.test_receipts import respell
from ..helpers import TEST_KEYS, market_core, party, purchase, registration, value

ROOT = Path(__file__).resolve().parents[3]
T = Topics("t")
SMALL = range(-300, 301)


def counts_core(*buyers: str) -> MarketCore:
    """A one-coordinate discrete Laplace stream (the red team's easiest case) with one value."""
    c = market_core("seller1", *buyers)
    out = c.handle(T.registrations, registration("c", mechanism="discrete_laplace", dimension=1))
    assert out.status == "accepted", out.reason
    c.handle(T.values, value("c", "v0", [12.0]))
    return c


def bought(c: MarketCore, buyer: str, pid: str = "p1", **kw: Any) -> tuple[bytes, Any]:
    out = c.handle(T.purchases, purchase("c", buyer, pid, **kw))
    assert out.status == "fulfilled", out.reason
    raw = next(o.value for o in out.outputs if o.topic == T.inbox(buyer))
    return raw, INBOX_EVENT.validate_json(raw)


def test_a_stranger_reading_a_sealed_outcome_cannot_find_the_count() -> None:
    c = counts_core("sealed_alice")
    raw, ev = bought(c, "sealed_alice")
    assert isinstance(ev, PurchaseFulfilled) and ev.sealed is not None
    assert ev.releases == [] and ev.opening is None and b"opening" not in raw  # never in clear
    rec = ev.receipt
    assert rec.receipt_version == 4 and rec.release_digest is None and rec.commitment
    opened = open_event(ev, party("sealed_alice").sealing_key)  # type: ignore[arg-type]
    (r,) = opened.releases
    assert opened.opening is not None and r.values[0].is_integer()

    def guess(x: int) -> list[tuple[str, float, list[float]]]:
        return [("v0", rec.level_after, [float(x)])]

    # the digest a version 2 receipt carried gives the count away to anyone who tries them all
    old = release_digest([("v0", rec.level_after, r.values)])
    assert [x for x in SMALL if release_digest(guess(x)) == old] == [int(r.values[0])]
    # the commitment: no guess matches under anything a stranger holds ...
    tries = [bytes(32), bytes.fromhex(rec.commitment), bytes.fromhex(rec.ciphertext_digest)]
    assert not [x for x in SMALL for o in tries if commitment(o, guess(x)) == rec.commitment]
    # ... and the buyer's opening matches exactly the released count
    mine = bytes.fromhex(opened.opening)
    assert [x for x in SMALL if commitment(mine, guess(x)) == rec.commitment] == [r.values[0]]
    assert verify_outcome(opened.model_dump(), TEST_KEYS.public_key).purchase_id == "p1"


def test_the_opening_is_a_function_of_the_purchase_and_a_replay_recomputes_it() -> None:
    c = counts_core("alice", "bob")
    _, a = bought(c, "alice")
    _, b = bought(c, "bob")
    assert isinstance(a, PurchaseFulfilled) and isinstance(b, PurchaseFulfilled)
    assert a.opening and b.opening and a.opening != b.opening  # in clear beside clear numbers
    assert a.receipt.commitment != b.receipt.commitment  # the same numbers, another opening
    again = counts_core("alice")
    _, a2 = bought(again, "alice")
    assert a2 == a  # a second worker (or a replay) computes the same bytes
    assert verify_outcome(a.model_dump(), TEST_KEYS.public_key).buyer_id == "alice"


# ------------------------------------------------------------------------------- padding
SEALER = Sealer(b"s" * 32)
BUYER = public_key_b64(party("sealed_bob").sealing_key)  # type: ignore[arg-type]


def sealed_length(values: list[float], opening: bytes | None = b"o" * 32) -> int:
    releases = [ReleasedValue(value_id="v1", seq=7, level=1.0, values=values)]
    return len(seal_releases(SEALER, BUYER, releases, b"p1", opening).ciphertext)


def test_equal_shapes_seal_to_equal_lengths() -> None:
    """1-digit against 17-digit numbers, negative against positive, zeros, the widest
    spelling of a double: one length for one shape."""
    shapes = [
        [1.0, 2.0, 3.0],
        [-0.12345678901234568, 1234567890123456.8, -9.0],
        [-2.2250738585072014e-308, -0.000012345678901234568, -1.7976931348623157e308],
        [0.0, -0.0, 5e-324],
    ]
    assert len({sealed_length(v) for v in shapes}) == 1
    assert len({sealed_length(v, None) for v in shapes}) == 1  # deliveries too
    assert sealed_length([1.0]) == sealed_length([-1.2345678901234567e-300])
    assert sealed_length([1.0]) != sealed_length([1.0, 1.0])  # the dimension is public


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=3, max_size=3))
def test_no_double_is_spelled_wider_than_the_padding(values: list[float]) -> None:
    assert sealed_length(values) == sealed_length([0.0, 0.0, 0.0])


def test_every_double_fits_the_number_width() -> None:
    """The width the padding counts is the widest JSON spelling of any double (random bits,
    every exponent)."""
    rng = np.random.default_rng(30)
    bits = rng.integers(0, 2**64, size=200_000, dtype=np.uint64).view(np.float64)
    scaled = [(rng.random(2_000) * 2 - 1) * 10.0**e for e in range(-330, 310, 7)]
    xs = np.concatenate([bits[np.isfinite(bits)], *scaled])
    spelled = releases_json([ReleasedValue(value_id="v", seq=0, level=1.0, values=xs.tolist())])
    numbers = json.loads(spelled)[0]["values"]
    listed = spelled.decode().split('"values":[', 1)[1].split("]")[0]
    widest = max(len(t) for t in listed.split(","))
    assert widest == NUMBER_WIDTH and len(numbers) == xs.size


def test_sealed_outcomes_of_very_different_counts_have_one_length() -> None:
    """Through the market: purchases and deliveries of 1-digit and 17-digit, negative and
    positive values on one stream shape seal to one length, and still open."""
    lengths, clear = set(), set()
    for k, x in enumerate([3.0, -3.0, 1234567.8912345678, -0.000012345678901234568]):
        c = market_core("seller1", "sealed_alice")
        c.handle(T.registrations, registration("c", dimension=2))
        c.handle(T.values, value("c", "v0", [x, -x]))
        _, ev = bought(c, "sealed_alice", pid=f"p{k}")
        out = c.handle(T.values, value("c", "v1", [x / 3, 7.0]))
        (sub,) = [
            INBOX_EVENT.validate_json(o.value)
            for o in out.outputs
            if o.topic == T.inbox("sealed_alice")
        ]
        assert isinstance(sub, ValueReleased) and sub.sealed and ev.sealed
        lengths.add((len(ev.sealed.ciphertext), len(sub.sealed.ciphertext)))
        opened = open_event(ev, party("sealed_alice").sealing_key)  # type: ignore[arg-type]
        assert verify_outcome(opened.model_dump(), TEST_KEYS.public_key).purchase_id == f"p{k}"
        clear.add(len(releases_json(opened.releases)))
    assert len(lengths) == 1, lengths
    assert len(clear) > 1  # unpadded, the lengths would have differed


# -------------------------------------------------------------------- verify-receipt
def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize("style", ["js", "exp"])
def test_verify_receipt_survives_a_json_tool(style: str, tmp_path: Path) -> None:
    """The opened outcome as `buy --output` writes it, re-spelled (``2.0`` as ``2`` or
    ``2.0000000000000000e+00``, keys reversed): valid; one number changed: invalid."""
    c = counts_core("sealed_alice")
    _, ev = bought(c, "sealed_alice")
    opened = open_event(ev, party("sealed_alice").sealing_key)  # type: ignore[arg-type]
    data = json.loads(opened.model_dump_json(indent=2))
    text = respell(data, style)
    assert ('"level_after":0.5' in text) == (style == "js")
    path = tmp_path / "outcome.json"
    path.write_text(text)
    key = TEST_KEYS.public_key_b64
    ok = cli("verify-receipt", str(path), "--public-key", key)
    assert ok.returncode == 0 and ok.stdout.startswith("valid: purchase p1"), ok.stdout + ok.stderr
    data["releases"][0]["values"][0] += 1
    path.write_text(respell(data, style))
    bad = cli("verify-receipt", str(path), "--public-key", key)
    assert bad.returncode == 1 and "INVALID" in bad.stdout and "differ" in bad.stdout
