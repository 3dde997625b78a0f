"""Noise as a pure function of the request, checked through the market core.

A release of (stream, value, level) must be the same bytes whatever the market remembers: after
every table, marker and cache is dropped, in any order of purchases, on any worker. And the laws
of what the *service* releases are the lossless process's (marginals, atoms, covariances).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from scipy import stats

from streams.core import MarketCore, Stores
from streams.core.context import Limits
from streams.core.products import retained, vectors
from streams.wire.events import INBOX_EVENT
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, open_accounts, purchase, registration, value

T = Topics("t")
DAY = 86_400_000
NOW = 100 * DAY


BUYERS = ("alice", "bob", "b", "x", "y", "sealed_alice")


def core(clock: int = NOW, **kw: Any) -> MarketCore:
    c = MarketCore(Stores(), TEST_KEYS, T, clock=lambda: clock, **kw)
    open_accounts(c, "seller1", *BUYERS)
    return c


def releases(outcome: Any) -> dict[tuple[str, float], bytes]:
    """(value id, level) → the released numbers' bytes, from a buyer's events."""
    out = {}
    for o in outcome.outputs:
        if o.topic.startswith("t.inbox.") and o.topic != "t.inbox.seller1":
            ev = INBOX_EVENT.validate_json(o.value)
            for r in getattr(ev, "releases", []):
                out[(r.value_id, r.level)] = np.asarray(r.values).tobytes()
    return out


LOG = [
    (T.registrations, registration("s", dimension=50, retain_last=3, steps=[0.5, 1.0, 2.0])),
    *[
        (T.values, value("s", f"v{i}", list(np.arange(50.0) + i), published_at_ms=NOW))
        for i in range(4)
    ],
    (T.purchases, purchase("s", "alice", "a1", requested_at_ms=NOW)),
    (T.purchases, purchase("s", "bob", "b1", target_level=2.0, requested_at_ms=NOW)),
    (T.values, value("s", "v4", [7.0] * 50, published_at_ms=NOW)),
    (T.purchases, purchase("s", "alice", "a2", target_level=4.0, requested_at_ms=NOW)),
    (T.values, value("s", "v5", [9.0] * 50, published_at_ms=NOW)),
]


def run(log: list[tuple[str, bytes]], drop_between: bool = False) -> list[bytes]:
    c = core()
    out = []
    for topic, payload in log:
        out += [o.value for o in c.handle(topic, payload).outputs]
        if drop_between:  # forget every cache: the market may drop them at any time
            for state in c.stores.releases.values():
                getattr(state, "drop_cache", lambda: None)()
    return out


def test_same_log_on_a_fresh_market_gives_identical_bytes() -> None:
    """Every release and every outcome (receipts, sealed envelopes included) is a function of
    the event log and the secret: a market with no state reproduces them byte for byte."""
    key_log = [(t, p) for t, p in LOG]  # sealed_alice's releases are sealed: envelopes compared
    key_log[5] = (T.purchases, purchase("s", "sealed_alice", "a1", requested_at_ms=NOW))
    first = run(key_log)
    assert first == run(key_log)
    assert first == run(key_log, drop_between=True)


def test_buying_in_another_order_gives_the_same_releases() -> None:
    a, b = core(), core()
    for c in (a, b):
        c.handle(*LOG[0])
        for ev in LOG[1:5]:
            c.handle(*ev)
    steps = {}
    for i, lvl in enumerate((0.5, 1.0, 2.0)):
        steps.update(
            releases(
                a.handle(
                    T.purchases, purchase("s", "x", f"p{i}", target_level=lvl, requested_at_ms=NOW)
                )
            )
        )
    direct = releases(
        b.handle(T.purchases, purchase("s", "y", "q", target_level=2.0, requested_at_ms=NOW))
    )
    assert direct and all(steps[k] == v for k, v in direct.items())


def attack(
    c: MarketCore, dim: int, resent: list[float] | None = None
) -> tuple[dict[Any, bytes], dict[Any, bytes], float]:
    """The seller's attack of issue #12: make the market forget V, then publish V again
    (``resent``: the same numbers spelled otherwise)."""
    x = list(np.linspace(-1, 1, dim))
    c.handle(
        T.registrations,
        registration("s", dimension=dim, steps=[1.0, 2.0, 4.0], cap=4.0, retain_last=1),
    )
    c.handle(T.values, value("s", "V", x, published_at_ms=NOW - 7 * DAY + 1_800_000))
    first = releases(c.handle(T.purchases, purchase("s", "b", "p1", requested_at_ms=NOW)))
    first |= releases(c.handle(T.purchases, purchase("s", "b", "p2", requested_at_ms=NOW)))
    c.handle(T.values, value("s", "W", [0.0] * dim, published_at_ms=NOW + 3_000_000))
    assert "s/V" not in c.stores.releases  # V and its marker are gone
    spent = c.stores.streams["s"].spent_nano
    again = releases(c.handle(T.values, value("s", "V", resent or x, published_at_ms=NOW)))
    return first, again, spent


def test_a_forgotten_value_sent_again_gets_the_same_release_not_fresh_noise() -> None:
    c = core()
    first, again, spent = attack(c, 2000)
    assert again[("V", 2.0)] == first[("V", 2.0)]
    assert c.stores.streams["s"].spent_nano == spent == 2 * 10**9


def test_a_forgotten_zero_sent_again_as_minus_zero_gets_the_same_release() -> None:
    """-0.0 and 0.0 are one number: spelled either way, a value has one digest, so one noise
    (the red team's finding: the sign bit of a zero bought a fresh sample after the market
    forgot the value)."""
    c = core()
    x = list(np.linspace(-1, 1, 2001))  # holds an exact 0.0
    zero = x.index(0.0)
    first, again, _ = attack(c, 2001, resent=[*x[:zero], -0.0, *x[zero + 1 :]])
    assert again[("V", 2.0)] == first[("V", 2.0)]


def test_different_numbers_under_one_id_get_independent_noise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The digest of the numbers is in the key: the same noise on other numbers would reveal
    their difference exactly. Shown with power: without the digest, the check fails."""

    def noise_overlap() -> float:
        c = core()
        c.handle(
            T.registrations, registration("s", dimension=2000, steps=[1.0], cap=1.0, retain_last=1)
        )
        x, y = np.zeros(2000), np.linspace(0, 5, 2000)
        c.handle(T.values, value("s", "V", list(x), published_at_ms=NOW - 8 * DAY))
        r1 = releases(c.handle(T.purchases, purchase("s", "b", "p", requested_at_ms=NOW)))
        c.handle(T.values, value("s", "W", [0.0] * 2000, published_at_ms=NOW))  # V forgotten
        r2 = releases(c.handle(T.values, value("s", "V", list(y), published_at_ms=NOW)))
        n1 = np.frombuffer(r1[("V", 1.0)]) - x
        n2 = np.frombuffer(r2[("V", 1.0)]) - y
        # the same lattice noise on either value: equal up to the rounding of x to the grid
        return float(np.mean(np.isclose(n1, n2, rtol=0, atol=1e-6)))

    assert noise_overlap() < 0.01
    without_digest = lambda sid, vid, digest: (sid, vid)  # noqa: E731
    monkeypatch.setattr(retained, "value_identity", without_digest)
    monkeypatch.setattr(vectors, "value_identity", without_digest)
    assert noise_overlap() > 0.99


def test_service_releases_have_the_lossless_laws() -> None:
    """Marginals, the atom P(V_k = V_{k−1}) = (ε_{k−1}/ε_k)² and Cov across steps, measured on
    what the market core releases to a buyer stepping up a Laplace stream."""
    dim, steps = 20_000, [0.5, 1.0, 2.0, 4.0]
    c = core(limits=Limits(max_message_bytes=8 << 20))  # two values of 20,000 numbers a message
    c.handle(T.registrations, registration("s", dimension=dim, steps=steps, cap=4.0, retain_last=2))
    for v in ("a", "b"):
        c.handle(T.values, value("s", v, [0.0] * dim, published_at_ms=NOW))
    ys = []
    for i in range(len(steps)):
        got = releases(c.handle(T.purchases, purchase("s", "x", f"p{i}", requested_at_ms=NOW)))
        ys.append(np.concatenate([np.frombuffer(got[(v, steps[i])]) for v in ("a", "b")]))
    n = ys[0].size
    for lvl, y in zip(steps, ys, strict=True):
        assert stats.kstest(y, stats.laplace(scale=1 / lvl).cdf).pvalue > 1e-3
    for k in range(1, len(steps)):
        atom = (steps[k - 1] / steps[k]) ** 2
        got = float(np.mean(ys[k] == ys[k - 1]))
        assert abs(got - atom) < 4 * np.sqrt(atom * (1 - atom) / n), (k, got)
    for j in range(len(steps)):
        for k in range(j + 1, len(steps)):
            cov = float(np.mean(ys[j] * ys[k]))
            assert abs(cov - 2 / steps[k] ** 2) < 0.06 * 2 / steps[j] / steps[k], (j, k, cov)


def test_service_discrete_laplace_releases_are_exact_and_lossless() -> None:
    """What the core releases on a discrete Laplace stream: whole numbers with the DLap(e^-ε)
    pmf at each step (chi-square), the atom P(V_k = V_{k−1}) = w₀ + (1 − w₀)·c_{k−1} (not w₀:
    the step's DLap part has mass at 0 too, docs/math.md §4.5) and Cov = Var of the more
    accurate release."""
    dim, steps = 20_000, [0.5, 1.0, 2.0]
    c = core(limits=Limits(max_message_bytes=8 << 20))
    c.handle(
        T.registrations,
        registration(
            "s", mechanism="discrete_laplace", dimension=dim, steps=steps, cap=2.0, retain_last=2
        ),
    )
    for v in ("a", "b"):
        c.handle(T.values, value("s", v, [7] * dim, published_at_ms=NOW))
    ys = []
    for i in range(len(steps)):
        got = releases(c.handle(T.purchases, purchase("s", "x", f"p{i}", requested_at_ms=NOW)))
        ys.append(np.concatenate([np.frombuffer(got[(v, steps[i])]) for v in ("a", "b")]) - 7)
    n = ys[0].size
    p = [float(np.exp(-lvl)) for lvl in steps]
    for pk, y in zip(p, ys, strict=True):
        assert np.array_equal(y, np.round(y))
        k = np.arange(-40, 41)
        expected = (1 - pk) / (1 + pk) * pk ** np.abs(k) * n
        k, expected = k[expected > 5], expected[expected > 5]  # the rest: one pooled bin
        observed = np.array([np.count_nonzero(y == j) for j in k])
        obs = np.append(observed, n - observed.sum())
        chi = stats.chisquare(obs, np.append(expected, n - expected.sum()))
        assert chi.pvalue > 1e-4, (pk, chi)
    for k in range(1, len(steps)):
        p1, p2 = p[k - 1], p[k]
        w0 = (1 - p1) ** 2 * p2 / ((1 - p2) ** 2 * p1)
        atom = w0 + (1 - w0) * (1 - p1) / (1 + p1)
        got = float(np.mean(ys[k] == ys[k - 1]))
        assert abs(got - atom) < 4.5 * np.sqrt(atom * (1 - atom) / n), (k, got, atom)
    for j in range(len(steps)):
        for k in range(j + 1, len(steps)):
            var_k = 2 * p[k] / (1 - p[k]) ** 2
            var_j = 2 * p[j] / (1 - p[j]) ** 2
            got = float(np.cov(ys[j], ys[k])[0, 1])
            assert abs(got - var_k) < 0.05 * var_j, (j, k, got, var_k)


@pytest.mark.parametrize(
    ("mech", "steps"), [("gaussian", [0.5, 1.0, 2.0]), ("poisson", [0.02, 0.05, 0.1])]
)
def test_service_gaussian_and_poisson_covariances(mech: str, steps: list[float]) -> None:
    dim = 20_000
    c = core()
    c.handle(
        T.registrations,
        registration("s", mechanism=mech, dimension=dim, steps=steps, cap=steps[-1], retain_last=1),
    )
    c.handle(T.values, value("s", "a", [0] * dim, published_at_ms=NOW))
    ys = []
    for i, lvl in enumerate(steps):
        got = releases(c.handle(T.purchases, purchase("s", "x", f"p{i}", requested_at_ms=NOW)))
        ys.append(np.frombuffer(got[("a", lvl)]))
    var = [1 / (2 * lvl) for lvl in steps] if mech == "gaussian" else [1 / lvl for lvl in steps]
    for j in range(len(steps)):
        for k in range(j, len(steps)):
            want = var[k]  # the lossless covariance: the variance of the more accurate release
            got = float(np.cov(ys[j], ys[k])[0, 1])
            assert abs(got - want) < 0.05 * var[j], (mech, j, k, got, want)


def test_a_market_with_another_secret_refuses_the_stream() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from streams.core import MarketKeys

    a = core()
    a.handle(*LOG[0])
    other = MarketKeys(Ed25519PrivateKey.from_private_bytes(bytes(32)), b"m" * 32)
    b = MarketCore(a.stores, other, T, clock=lambda: NOW)  # the same tables, another secret
    out = b.handle(
        T.values,
        value("s", "v9", [1.0] * 50, published_at_ms=NOW, sealed_for=other, market=b.ctx.market),
    )
    assert out.reason == "market_secret_mismatch"
    assert "EMARKET_NOISE_SECRET" in json.loads(out.outputs[0].value)["message"]
