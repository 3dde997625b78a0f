"""Regenerate the results report: ``python -m bench.report`` (or ``make report``).

Writes ``docs/report.md`` and the PNG figures in ``docs/report/``: accuracy of lossless release
against composition and ε-doubling (Laplace, Gaussian), the shape of Andersson et al.'s Fig. 2,
sample paths of the Laplace process (Koufogiannis Fig. 1), the conditional law of V2 given V1
(Fig. 3), exact counts (discrete Laplace: its marginal and step atom), running totals (the error
of a total against the count), the applications
(sparse histograms, histogram streams as the market core releases them, factorization, RAPPOR,
social network), and the speed of the samplers (against numpy's inexact samplers and, with
the ``bench`` extra, OpenDP's exact ones), of histogram releases, of the market core (against
its crypto floor) and of the service (against the transport floor), all measured in this run.
``--quick`` uses small sizes (a smoke run); ``--no-service`` skips the broker benchmark;
``--only TITLE`` regenerates the sections whose title contains TITLE inside the existing report
and leaves the others byte for byte: each regenerated section says when it was, and the
header's date says that sections may be newer.
"""

from __future__ import annotations

import argparse
import io
import math
import re
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench import noise
from bench.machine import Machine
from market import DiscreteLaplace, Gaussian, Laplace, ReleaseState, default_rng
from market._draws import Draws, key_from
from market.factorization import (
    FactorizationRelease,
    prefix_sum_identity,
    prefix_sum_tree,
)
from market.histogram import DenseHistogramRelease, SparseHistogramRelease
from market.mechanisms import Anchor
from market.rappor import RapporClient, RapporParams, decode
from market.social import bfs_distances, collusion_experiment, random_graph

ROOT = Path(__file__).resolve().parents[1]


def _save(fig: Any, out: Path, name: str) -> str:
    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"report/{name}.png"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- figures
def accuracy(out: Path, n: int, steps: int) -> str:
    rows = noise.accuracy_table(n, steps)
    parts = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, mech in zip(axes, ("laplace", "gaussian"), strict=True):
        r = [x for x in rows if x[0] == mech]
        k = [x[1] for x in r]
        for col, label in (
            (2, "lossless"),
            (3, "composition (newest)"),
            (4, "composition + inverse-variance"),
            (5, "ε-doubling"),
        ):
            ax.plot(k, [x[col] for x in r], marker="o", ms=3, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("relaxation steps k (equal increments)")
        ax.set_ylabel("MSE / variance of one release at the final level")
        ax.set_title(f"{mech.capitalize()}")
        ax.legend(fontsize=8)
    img = _save(fig, out, "accuracy")
    table = _table(
        ["mechanism", "k", "lossless", "composition", "composition+IVW", "doubling"],
        [
            [m, k, f"{a:.3f}", f"{b:.2f}", f"{c:.2f}", f"{d:.2f}"]
            for m, k, a, b, c, d in rows
            if k in (1, 2, 5, 10, steps)
        ],
    )
    parts.append(f"![accuracy]({img})\n\n{table}")
    return "\n\n".join(parts)


def andersson_fig2(out: Path, n: int) -> str:
    rng = default_rng(11)
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = []
    for m in (2, 5, 10, 20):
        rhos = np.geomspace(0.001, 5.0, m)
        # independent releases: release k spends the increment rho_k - rho_{k-1}
        inc = np.diff(np.concatenate([[0.0], rhos]))
        var_ind = [float(np.var(rng.normal(0, math.sqrt(1 / (2 * d)), n))) for d in inc]
        ax.plot(rhos, var_ind, marker="o", ms=3, label=f"independent, {m} releases")
        rows.append([m, f"{var_ind[-1] * 2 * 5.0:.2f}"])
    st = ReleaseState(Gaussian(1.0), np.zeros(n))
    grid = np.geomspace(0.001, 5.0, 20)
    ax.plot(
        grid,
        [float(np.var(st.release(r, rng=rng))) for r in grid],
        "k-",
        lw=2,
        label="lossless (any number of releases)",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ρ")
    ax.set_ylabel("variance of the release at ρ")
    ax.legend(fontsize=8)
    img = _save(fig, out, "andersson_fig2")
    table = _table(["independent releases m", "variance at ρ = 5 / lossless"], rows)
    return f"![fig2]({img})\n\n{table}"


def sample_paths(out: Path) -> str:
    eps = np.linspace(0.05, 5.0, 400)
    st = ReleaseState(Laplace(1.0), np.zeros(6))
    rng = default_rng(12)
    paths = np.stack([np.asarray(st.release(e, rng=rng)) for e in eps])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(eps, paths, drawstyle="steps-post", lw=1)
    ax.set_ylim(-4, 4)
    ax.set_xlabel("ε")
    ax.set_ylabel("V_ε")
    ax.set_title("Sample paths of the Laplace release process (lazy: piecewise constant)")
    img = _save(fig, out, "paths")
    jumps = (np.diff(paths, axis=0) != 0).sum(axis=0)
    return (
        f"![paths]({img})\n\nSix independent paths over 400 levels in (0, 5]: each coordinate "
        f"changed value only {int(jumps.mean())} times on average (between "
        f"{int(jumps.min())} and {int(jumps.max())}); the rest of the grid shares samples."
    )


def conditional(out: Path, n: int) -> str:
    e1, e2 = 1.0, 2.0
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    rows = []
    for ax, x in zip(axes, (0.5, 2.0), strict=True):
        # V1 = x fixed, V2 drawn by the relaxation step (exact value 0, so releases are noise);
        # on the lattice of Laplace(1, dimension n), whose law is the continuous one's limit
        mech = Laplace(1.0, dimension=n)
        g = math.ldexp(1.0, mech.grid_exponent)
        upper = mech.origin(np.zeros(n))
        lower = Anchor(e1, np.full(n, round(x / g), dtype=np.int64))
        draws = Draws(key_from(default_rng(13)), n, mech.slots(e2, math.inf, e1))
        point = mech.conditional(e2, upper, lower, draws, np.zeros(n))
        y = np.asarray(mech.decode(point))
        atom = float(np.mean(y == x))
        moved = y[y != x]
        ax.hist(
            moved,
            bins=200,
            range=(-3, 4),
            density=True,
            alpha=0.5,
            label="sampled (continuous part)",
        )
        t = np.linspace(-3, 4, 1000)
        dens = (
            (e2**2 - e1**2) / (2 * e2) * np.exp(-e1 * np.abs(t - x) - e2 * np.abs(t) + e1 * abs(x))
        )
        ax.plot(
            t,
            dens / (1 - e1 / e2 * math.exp(-(e2 - e1) * abs(x))),
            "k-",
            label="eq. (22), normalised",
        )
        ax.axvline(x, color="r", ls="--", label=f"atom at x: {atom:.3f} sampled")
        ax.set_title(f"V2 | V1 = {x}  (ε1 = 1, ε2 = 2)")
        ax.legend(fontsize=8)
        rows.append([x, f"{atom:.4f}", f"{e1 / e2 * math.exp(-(e2 - e1) * abs(x)):.4f}"])
    img = _save(fig, out, "conditional")
    return f"![conditional]({img})\n\n" + _table(
        ["x", "P(V2 = x) sampled", "(ε1/ε2)·exp(−(ε2−ε1)·abs(x))"], rows
    )


def _dlap_pmf(eps: float, k: np.ndarray) -> np.ndarray:
    p = math.exp(-eps)
    return np.asarray((1 - p) / (1 + p) * p ** np.abs(k).astype(float), dtype=np.float64)


def discrete_laplace(out: Path, n: int) -> str:
    """Exact counts: a relaxed discrete Laplace release has the pmf of a fresh one (rounding a
    continuous Laplace does not), and the atom P(V1 = V2) of a step is w0 + (1 − w0)·c1."""
    rng = default_rng(18)
    mech, e_lo, e_hi = DiscreteLaplace(1.0), 0.5, 2.0
    st = ReleaseState(mech, np.zeros(n, dtype=np.int64))
    st.release(e_hi, rng=rng)
    v_lo = np.asarray(st.release(e_lo, rng=rng))  # relaxed from the ε = 2 release
    naive = np.round(rng.laplace(0.0, 1.0 / e_lo, n))
    k = np.arange(-8, 9)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    ax.bar(k - 0.2, [np.mean(v_lo == j) for j in k], 0.4, label="relaxed ε = 2 → 0.5 (sampled)")
    ax.bar(k + 0.2, [np.mean(naive == j) for j in k], 0.4, label="round(Laplace(1/0.5))")
    ax.plot(k, _dlap_pmf(e_lo, k), "k_", ms=14, mew=2, label="DLap(e^-0.5) pmf")
    ax.set_xlabel("noise k")
    ax.set_title("Marginal at ε = 0.5")
    ax.legend(fontsize=8)
    rows, ratios = [], [0.1, 0.25, 0.5, 0.75, 0.9]
    got, want, cont = [], [], []
    for r in ratios:
        e1, e2 = r * 2.0, 2.0
        s2 = ReleaseState(mech, np.zeros(n // 4, dtype=np.int64))
        a, b = np.asarray(s2.release(e2, rng=rng)), np.asarray(s2.release(e1, rng=rng))
        p1, p2 = math.exp(-e1), math.exp(-e2)
        w0 = (1 - p1) ** 2 * p2 / ((1 - p2) ** 2 * p1)
        got.append(float(np.mean(a == b)))
        want.append(w0 + (1 - w0) * (1 - p1) / (1 + p1))
        cont.append(r**2)
        rows.append(
            [
                f"{e1:g} → {e2:g}",
                f"{got[-1]:.4f}",
                f"{want[-1]:.4f}",
                f"{w0:.4f}",
                f"{cont[-1]:.4f}",
            ]
        )
    ax = axes[1]
    ax.plot(ratios, got, "o", label="sampled P(V_ε1 = V_ε2)")
    ax.plot(ratios, want, "k-", label="w0 + (1 − w0)·c1")
    ax.plot(ratios, cont, "--", label="continuous Laplace (ε1/ε2)²")
    ax.set_xlabel("ε1 / ε2 (ε2 = 2)")
    ax.set_title("Atom of one step")
    ax.legend(fontsize=8)
    img = _save(fig, out, "discrete_laplace")
    tv_relaxed = 0.5 * float(np.sum(np.abs([np.mean(v_lo == j) for j in k] - _dlap_pmf(e_lo, k))))
    tv_naive = 0.5 * float(np.sum(np.abs([np.mean(naive == j) for j in k] - _dlap_pmf(e_lo, k))))
    return (
        f"![discrete_laplace]({img})\n\n{n:,} coordinates. Total variation from the DLap pmf "
        f"(|k| ≤ 8): relaxed release {tv_relaxed:.4f} (sampling error), rounded continuous "
        f"Laplace {tv_naive:.4f}: the rounded sampler is another law (it puts "
        f"{np.mean(naive == 0):.3f} at 0 against {_dlap_pmf(e_lo, np.array([0]))[0]:.3f}).\n\n"
        + _table(
            ["step", "P(V1 = V2) sampled", "w0 + (1 − w0)·c1", "w0 alone", "continuous (ε1/ε2)²"],
            rows,
        )
    )


def _report_market(stream_id: str, **registration: Any) -> tuple[Any, Any, Any]:
    """An in-process market core (the service's own code path) with a seller, a buyer and one
    Gaussian stream registered by the seller with ``registration``; returns the seller, the
    buyer and ``send(kind, signer, **fields)``: sign a ``values`` batch or a ``purchase``,
    apply it, and return the events it put in the buyer's inbox."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from streams.clients.keys import Party
    from streams.core import MarketCore, MarketKeys, Stores
    from streams.core.context import Limits
    from streams.wire.events import (
        INBOX_EVENT,
        LinearLevelSpec,
        PurchaseRequest,
        StreamRegistration,
        ValueBatch,
    )
    from streams.wire.sealing import seal_values
    from streams.wire.topics import Topics

    topics = Topics("r")
    keys = MarketKeys(Ed25519PrivateKey.generate(), b"report" * 6)
    core = MarketCore(
        Stores(), keys, topics, clock=lambda: 1_000, limits=Limits(max_message_bytes=64 << 20)
    )
    seller, buyer = Party.generate("seller", sealing=False), Party.generate("buyer", sealing=False)
    for p in (seller, buyer):
        opening = p.open_account(core.ctx.market, opened_at_ms=1)
        core.handle(topics.accounts, opening.model_dump_json().encode())
    reg = seller.sign(
        StreamRegistration,
        core.ctx.market,
        stream_id=stream_id,
        seller_id="seller",
        mechanism="gaussian",
        sensitivity=1.0,
        pricing=LinearLevelSpec(rate_per_level=1.0),
        **registration,
    )
    core.handle(topics.registrations, reg.model_dump_json().encode())
    kinds = {"values": (ValueBatch, topics.values), "purchase": (PurchaseRequest, topics.purchases)}

    def send(kind: str, signer: Any, **fields: Any) -> list[Any]:
        model, topic = kinds[kind]
        event = signer.sign(model, core.ctx.market, **fields)
        if isinstance(event, ValueBatch):  # sealed to the market's key, as a client sends it
            sealed = seal_values(event, "r", keys.sealing_public_b64)
            event = signer.sign(
                model, core.ctx.market, **sealed.model_dump(exclude={"key_id", "signature"})
            )
        raw = event.model_dump_json().encode()
        return [
            INBOX_EVENT.validate_json(o.value)
            for o in core.handle(topic, raw).outputs
            if o.topic == topics.inbox("buyer")
        ]

    return seller, buyer, send


def _service_totals(height: int, dim: int, rho: float) -> dict[int, float]:
    """RMS error of each running total a subscriber at ``rho`` receives from the market core
    (the service's own code path), over ``dim`` coordinates of zero increments."""
    seller, buyer, send = _report_market(
        "tot",
        dimension=dim,
        steps=[rho],
        cap=rho,
        retain_last=1,
        product="running_totals",
        tree_height=height,
    )
    send(
        "purchase",
        buyer,
        purchase_id="p",
        buyer_id="buyer",
        stream_id="tot",
        max_price_minor=10**6,
        requested_at_ms=1,
    )
    rmse: dict[int, float] = {}
    zero = [0.0] * dim
    for b in range(0, 1 << height, 16):
        items = [
            {"value_id": f"v{i}", "values": zero, "published_at_ms": 1} for i in range(b, b + 16)
        ]
        for ev in send("values", seller, stream_id="tot", seller_id="seller", items=items):
            for r in ev.releases:
                rmse[r.seq + 1] = float(np.sqrt(np.mean(np.square(r.values))))
    return rmse


def running_totals(out: Path, quick: bool) -> str:
    """Continual counting through the tree: the MSE of a total grows like log² n."""
    height, rho = (8, 1.0) if quick else (10, 1.0)
    dim = 500 if quick else 2000
    measured = _service_totals(height, dim, rho)
    t = np.arange(1, (1 << height) + 1)
    pop = np.array([int(x).bit_count() for x in t])
    theory = np.sqrt(pop * (height + 1) / (2 * rho))
    naive = np.sqrt(t / (2 * rho))  # each increment noised alone at ρ, then added up
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    ax.plot(t, [measured[int(x)] for x in t], ".", ms=2, label="tree, measured (market core)")
    ax.plot(t, theory, "k-", lw=0.6, label="tree, √(popcount(t)(h+1)/(2ρ))")
    ax.plot(t, naive, "--", label="each increment noised, summed: √(t/(2ρ))")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"increments t (tree height h = {height}, ρ = {rho:g})")
    ax.set_ylabel("RMS error of the running total")
    ax.legend(fontsize=8)
    ax = axes[1]
    hs = np.arange(1, 31)
    n = 2.0**hs
    ax.plot(n, hs / 2 * (hs + 1) / (2 * rho), "o-", ms=3, label="tree: mean MSE, (h/2)(h+1)/(2ρ)")
    ax.plot(n, hs * (hs + 1) / (2 * rho), "s-", ms=3, label="tree: worst MSE, h(h+1)/(2ρ)")
    ax.plot(n, (n + 1) / (4 * rho), "--", label="noised increments: mean MSE, (n+1)/(4ρ)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("stream length n = 2^h")
    ax.set_ylabel("MSE over the totals of the stream")
    ax.legend(fontsize=8)
    img = _save(fig, out, "running_totals")
    rows = [
        [x, int(x).bit_count(), f"{measured[x]:.3f}", f"{theory[x - 1]:.3f}", f"{naive[x - 1]:.3f}"]
        for x in dict.fromkeys((1, 2, 3, 7, 8, 255, 256, 511, (1 << height) - 1, 1 << height))
        if x in measured
    ]
    return (
        f"![running_totals]({img})\n\nLeft: what a subscriber at ρ = {rho:g} received from the "
        f"market core for each of 2^{height} totals ({dim} coordinates each). Right: the MSE "
        "of the tree grows like log² n (h = log₂ n nodes of variance ∝ h + 1), the sum of "
        "individually noised increments like n.\n\n"
        + _table(["t", "nodes", "RMS error measured", "tree theory", "noised increments"], rows)
    )


def _service_histograms(
    levels: list[float], counts: dict[str, float], values: int
) -> dict[float, list[tuple[list[str], list[float]]]]:
    """What one buyer gets from the market core (the service's own code path) when it buys
    each level in turn of a histogram stream holding ``values`` copies of ``counts`` (each
    under its own value id, so with its own noise): level → releases (keys, noisy counts)."""
    seller, buyer, send = _report_market(
        "h",
        dimension=len(counts),
        steps=levels,
        cap=levels[-1],
        retain_last=values,
        product="histogram",
        histogram={"key_space": "integers", "domain_size": 2**40, "false_keys": 1.0},
    )
    for b in range(0, values, 50):
        items = [
            {
                "value_id": f"v{i}",
                "keys": list(counts),
                "values": list(counts.values()),
                "published_at_ms": 1,
            }
            for i in range(b, min(values, b + 50))
        ]
        send("values", seller, stream_id="h", seller_id="seller", items=items)
    out: dict[float, list[tuple[list[str], list[float]]]] = {}
    for i, lvl in enumerate(levels):
        (ev,) = send(
            "purchase",
            buyer,
            purchase_id=f"p{i}",
            buyer_id="buyer",
            stream_id="h",
            target_level=lvl,
            max_price_minor=10**6,
            requested_at_ms=1,
        )
        out[lvl] = [(r.keys or [], r.values) for r in ev.releases]
    return out


def _selected_error(counts: list[float], tau: float, sigma: float) -> tuple[float, float]:
    """RMS and mean error of the released counts of keys with these true counts, when a count
    is released only if count + N(0, σ²) > τ (a truncated normal: with ``a = (τ − c)/σ``,
    ``P = Φ(−a)``, ``P·E[e] = σφ(a)``, ``P·E[e²] = σ²(P + aφ(a))``, summed over the keys)."""
    from scipy import special

    a = (tau - np.asarray(counts)) / sigma
    phi = np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
    p = special.ndtr(-a)
    shown = float(p.sum())
    return (
        math.sqrt(sigma**2 * float((p + a * phi).sum()) / shown),
        sigma * float(phi.sum()) / shown,
    )


HIST_STREAM_LEVELS = [0.01, 0.1, 1.0, 10.0]
HIST_STREAM_COUNTS = [1, 2, 3, 5, 8, 13, 20, 30, 50, 80]
"""True counts of a value's 50 keys, five keys each."""


def _false_keys_panel(
    ax: Any,
    got: dict[float, list[tuple[list[str], list[float]]]],
    counts: dict[str, float],
    m: float,
    per_level: list[tuple[float, float]],
) -> tuple[float, float]:
    """Bars of the keys with a zero count per release (mean ± standard error) against m/K,
    and of the distinct ones over a value's releases against m; returns the latter."""
    levels = list(got)
    values = len(got[levels[0]])
    distinct = [
        len({k for lv in levels for k in got[lv][i][0] if k not in counts}) for i in range(values)
    ]
    total = (float(np.mean(distinct)), float(np.std(distinct) / math.sqrt(values)))
    labels = [f"ρ = {lv:g}" for lv in levels] + [f"all {len(levels)},\ndistinct"]
    ax.bar(
        labels,
        [x for x, _ in per_level] + [total[0]],
        yerr=[x for _, x in per_level] + [total[1]],
        capsize=3,
        color=["C0"] * len(levels) + ["C1"],
        label="measured (± standard error)",
    )
    ax.hlines(
        m / len(levels),
        -0.4,
        len(levels) - 0.6,
        colors="k",
        lw=0.9,
        ls="--",
        label=f"tolerance per release, m/K = {m / len(levels):g}",
    )
    ax.hlines(
        m,
        len(levels) - 0.4,
        len(levels) + 0.4,
        colors="r",
        lw=0.9,
        ls="--",
        label=f"tolerance over all releases, m = {m:g}",
    )
    ax.set_ylabel("keys with a zero count released")
    ax.set_title("false keys per value", fontsize=10)
    ax.legend(fontsize=7)
    return total


def histogram_stream(out: Path, quick: bool) -> str:
    """Histogram streams from the market core: which true keys each level releases against
    their count, how many keys with a zero count, and the error of the released counts."""
    from scipy import special

    from market.histogram_chain import HistogramChain, threshold

    levels, grid, per = HIST_STREAM_LEVELS, HIST_STREAM_COUNTS, 5
    domain, m = 2**40, 1.0
    spacing = domain // (len(grid) * per)  # keys spread over the domain
    counts = {
        str((i * per + j) * spacing + 7): float(c) for i, c in enumerate(grid) for j in range(per)
    }
    values = 100 if quick else 1000
    got = _service_histograms(levels, counts, values)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), width_ratios=[1.35, 1])
    rows = []
    xs = np.geomspace(0.8, 120, 300)
    false_per_level = []
    for lvl in levels:
        tau = threshold(lvl, 1.0, domain, m, len(levels))
        sigma = 1 / math.sqrt(2 * lvl)
        shown = dict.fromkeys(grid, 0)
        false, err = [], []
        for keys, vals in got[lvl]:
            false.append(sum(k not in counts for k in keys))
            for k, v in zip(keys, vals, strict=True):
                if k in counts:
                    shown[int(counts[k])] += 1
                    err.append(v - counts[k])
        recall = [shown[c] / (per * values) for c in grid]
        (line,) = axes[0].plot(grid, recall, "o", ms=4, label=f"ρ = {lvl:g} (τ = {tau:.1f})")
        axes[0].plot(xs, special.ndtr((xs - tau) / sigma), "-", lw=0.8, color=line.get_color())
        axes[0].axvline(tau, color=line.get_color(), lw=0.6, ls=":")
        want_rms, want_bias = _selected_error([float(c) for c in grid], tau, sigma)
        e = np.asarray(err)
        false_per_level.append((float(np.mean(false)), float(np.std(false) / math.sqrt(values))))
        rows.append(
            [
                f"{lvl:g}",
                f"{tau:.2f}",
                f"{sigma:.3f}",
                " / ".join(f"{recall[grid.index(c)]:.2f}" for c in (1, 5, 20, 80)),
                f"{float(np.sqrt(np.mean(e * e))):.3f} / {want_rms:.3f}",
                f"{float(np.mean(e)):+.3f} / {want_bias:+.3f}",
                f"{false_per_level[-1][0]:.3f} ± {false_per_level[-1][1]:.3f}",
            ]
        )
    axes[0].set_xscale("log")
    axes[0].set_xlabel("true count of a key")
    axes[0].set_ylabel("fraction of releases showing it")
    axes[0].set_title("true keys released (lines: Φ((c − τ)/σ); dotted: τ)", fontsize=10)
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    total = _false_keys_panel(axes[1], got, counts, m, false_per_level)
    # what the stream's chain expects: d · Σ_k P(a never-released zero count first exceeds τ_k)
    chain = HistogramChain(tuple(levels), sensitivity=1.0, domain=domain, false_keys=m)
    first = [r.p * (domain - len(counts)) for r in chain._rounds]
    predicted = sum(first)
    over = max(f * len(levels) / m for f in first[1:]) - 1.0
    img = _save(fig, out, "histogram_stream")
    headers = [
        "ρ",
        "threshold τ",
        "σ = Δ/√(2ρ)",
        "share shown at counts 1 / 5 / 20 / 80",
        "RMS error: measured / expected",
        "mean error: measured / expected",
        f"zero-count keys per release (m/K = {m / len(levels):g})",
    ]
    return (
        f"![histogram_stream]({img})\n\n{values} values of a histogram stream over 2^40 "
        f"integer keys, each the same {len(counts)} keys (true counts "
        f"{', '.join(str(c) for c in grid)}; {per} keys each) under its own value id, so with "
        "its own noise; published to the in-process market core and bought by one buyer at "
        f"each level in turn, ρ = {', '.join(f'{x:g}' for x in levels)} (false_keys m = "
        f"{m:g} over K = {len(levels)} levels, Δ = 1): what the service releases. Left: the "
        "fraction of releases showing a true key against its count, with Φ((c − τ)/σ); the "
        "curves move left as ρ grows (τ = zσ comes down with σ = Δ/√(2ρ)). Right: keys with a "
        "zero count per release, against the tolerance m/K each release is held to, and the "
        "distinct ones over a value's four releases, against m (the union bound: equal to it "
        "but for the keys two steps share, which levels ten times apart hardly do).\n\n"
        "Released counts of true keys carry the Gaussian noise σ but are **selected**: a key "
        "is shown only when its noisy count exceeds τ, so a small count (c near or below τ) "
        "is shown only with positive noise and its released count is biased upwards; counts "
        "far above τ are not. The table gives the RMS error and the mean error (bias) of the "
        "released counts of true keys, measured against the truncated normal's (each key's "
        "noise N(0, σ²) given c + noise > τ): where the released counts are near τ (ρ = 0.01: "
        "τ = 51 lets through the 80s and the 50s that the noise lifts) the expected RMS error "
        "is above σ; where most released keys are far above τ it is σ and the bias all but "
        "vanishes.\n\n"
        + _table(headers, rows)
        + f"\n\nDistinct zero-count keys over all four releases of a value: {total[0]:.3f} ± "
        f"{total[1]:.3f}; the tolerance is m = {m:g}, and the stream's own survival law "
        f"({chain.grid} cells) predicts {predicted:.4f}: its exceedance probability of a "
        f"never-released zero count is {over:.2%} above m/(dK) at a later step, where the "
        "exact law is at most m/(dK) (the grid's approximation, not sampling error)."
    )


def histograms(out: Path, quick: bool) -> str:
    rng = default_rng(14)
    rows = []
    ds = [2**10, 2**14, 2**18, 2**20] + ([] if quick else [2**24, 2**30, 2**40])
    k = 1000
    rounds = [(0.5, 9.0), (1.0, 8.0), (2.0, 7.0)]
    sparse_t, dense_t = [], []
    for d in ds:
        idx = rng.choice(d, size=min(k, d // 2), replace=False)
        counts = rng.integers(1, 100, size=idx.size).astype(float)
        m = SparseHistogramRelease(idx, counts, dimension=d, rng=rng, grid=1024)
        t0 = time.perf_counter()
        for r in rounds:
            m.release(*r)
        sparse_t.append((time.perf_counter() - t0) / len(rounds))
        if d <= 2**20:
            h = np.zeros(d)
            h[idx] = counts
            dm = DenseHistogramRelease(h, rng=rng)
            t0 = time.perf_counter()
            for r in rounds:
                dm.release(*r)
            dense_t.append((time.perf_counter() - t0) / len(rounds))
        rows.append(
            [
                f"2^{int(math.log2(d))}",
                f"{sparse_t[-1] * 1e3:.1f}",
                f"{dense_t[-1] * 1e3:.1f}" if d <= 2**20 else "—",
            ]
        )
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(ds, sparse_t, "o-", label="efficient (Alg. 6, exact)")
    ax.loglog(ds[: len(dense_t)], dense_t, "s-", label="dense (Alg. 3)")
    ax.set_xlabel("domain size d")
    ax.set_ylabel("seconds per round (k = 1000 non-zero counts)")
    ax.legend()
    img = _save(fig, out, "histogram_time")
    return f"![histogram]({img})\n\n" + _table(["d", "efficient ms/round", "dense ms/round"], rows)


def factorization(out: Path) -> str:
    rows = []
    ns = [16, 64, 256, 1024]
    tree_v, ident_v = [], []
    for n in ns:
        t = FactorizationRelease(*prefix_sum_tree(n), np.zeros(n)).answer_variance(1.0).max()
        i = FactorizationRelease(*prefix_sum_identity(n), np.zeros(n)).answer_variance(1.0).max()
        tree_v.append(t)
        ident_v.append(i)
        rows.append([n, f"{t:.1f}", f"{i:.1f}"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(ns, tree_v, "o-", label="binary tree L R")
    ax.loglog(ns, ident_v, "s-", label="identity (noise each prefix sum)")
    ax.set_xlabel("n (histogram length)")
    ax.set_ylabel("worst prefix-sum variance at ρ = 1")
    ax.legend()
    img = _save(fig, out, "factorization")
    return f"![factorization]({img})\n\n" + _table(["n", "tree", "identity"], rows)


def rappor(out: Path, quick: bool) -> str:
    rng = default_rng(15)
    cands = [f"site{i}" for i in range(8)]
    truth = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.07, 0.05, 0.03])
    users = rng.choice(len(cands), size=2000 if quick else 20000, p=truth)
    ladder = [
        RapporParams(k=64, hashes=2, alpha=a, beta=b, gamma=g)
        for a, b, g in [(0.8, 0.6, 0.45), (0.6, 0.7, 0.35), (0.4, 0.8, 0.25), (0.2, 0.9, 0.1)]
    ]
    clients = [RapporClient(cands[u], ladder[0], rng=rng) for u in users]
    rows, errs = [], []
    for p in ladder:
        est = decode(np.stack([c.report(p) for c in clients]), cands, p)
        est = est / max(est.sum(), 1e-12)
        errs.append(float(np.abs(est - truth).sum()))
        rows.append([p.alpha, p.beta, p.gamma, f"{p.permanent_epsilon:.2f}", f"{errs[-1]:.3f}"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(1, len(ladder) + 1), errs, "o-")
    ax.set_xlabel("relaxation step (α, γ down, β up)")
    ax.set_ylabel("L1 error of estimated frequencies")
    img = _save(fig, out, "rappor")
    return f"![rappor]({img})\n\n" + _table(["α", "β", "γ", "ε_f", "L1 error"], rows)


def social(out: Path, quick: bool) -> str:
    adj = random_graph(400, 3.0, rng=16)
    dist = bfs_distances(adj, 0)
    eps = 1.0 / dist[1:].astype(float)
    sizes = [1, 2, 5, 10, 20, 50, 100, 200]
    res = collusion_experiment(eps, sizes, trials=5000 if quick else 50_000, rng=17)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(sizes, res.independent_mse, "s-", label="independent releases, group average")
    ax.loglog(sizes, res.lossless_mse, "o-", label="lossless releases, group average")
    ax.loglog(sizes, res.best_member_mse, "k--", label="group's closest member alone")
    ax.set_xlabel("colluding group size (most distant members first)")
    ax.set_ylabel("MSE of the group's estimate")
    ax.legend(fontsize=8)
    img = _save(fig, out, "social")
    rows = [
        [s, f"{a:.2f}", f"{b:.2f}", f"{c:.2f}", f"{e1:.2f}", f"{e2:.1f}"]
        for s, a, b, c, e1, e2 in zip(
            res.group_sizes,
            res.lossless_mse,
            res.independent_mse,
            res.best_member_mse,
            res.lossless_epsilon,
            res.independent_epsilon,
            strict=True,
        )
    ]
    return f"![social]({img})\n\n" + _table(
        [
            "group",
            "lossless MSE",
            "independent MSE",
            "closest member MSE",
            "ε lossless (max)",
            "ε independent (sum)",
        ],
        rows,
    )


def _speed_sizes(quick: bool) -> tuple[int, int, int]:
    """Coordinates, repeats and runs: those of `python -m bench.noise` (``--quick`` or not)."""
    return (10_000, 3, 1) if quick else (1_000_000, 7, 3)


def speed(quick: bool) -> str:
    # the same function and sizes as `python -m bench.noise`: the report cannot disagree with it
    n, repeat, runs = _speed_sizes(quick)
    machine = Machine.now()
    return f"{noise.speed_markdown(n, repeat, runs)}\n\n{machine.line()}"


def exact_speed(quick: bool) -> str:
    # `python -m bench.noise`'s "Per coordinate" rows, same function and sizes
    _, _, runs = _speed_sizes(quick)
    machine = Machine.now()
    return f"{noise.exact_markdown(*noise.exact_sizes(quick), runs)}\n\n{machine.line()}"


def small_speed(quick: bool) -> str:
    # `python -m bench.noise`'s "Per call" rows, same function and sizes
    _, _, runs = _speed_sizes(quick)
    machine = Machine.now()
    return f"{noise.small_markdown(noise.small_calls(quick), runs)}\n\n{machine.line()}"


def histogram_speed(quick: bool) -> str:
    # `python -m bench.noise`'s "Histogram releases", same function and sizes
    _, repeat, runs = _speed_sizes(quick)
    machine = Machine.now()
    return f"{noise.histogram_markdown(repeat, runs)}\n\n{machine.line()}"


def core_cost(quick: bool) -> str:
    from bench import core

    buf = io.StringIO()
    with redirect_stdout(buf):  # exactly what `python -m bench.core` prints
        core.main(["--quick"] if quick else [])
    head, table = buf.getvalue().split("\n", 1)
    return f"`python -m bench.core`: {head.removeprefix('## ')}.\n\n{table.strip()}"


def service(quick: bool) -> str:
    from bench import service as svc

    buf = io.StringIO()
    with redirect_stdout(buf):  # exactly what `python -m bench.service` prints
        svc.main(["--quick"] if quick else [])
    head, body = buf.getvalue().split("\n", 1)
    kept = [line for line in body.strip().splitlines() if not line.startswith("(logs: ")]
    return f"`python -m bench.service`: {head.removeprefix('## ')}.\n\n" + "\n".join(kept)


# ---------------------------------------------------------------------------------- report
_GENERATED = re.compile(
    r"(Generated by `python -m bench\.report` on .*?, \d{4}-\d{2}-\d{2})"
    r"(?: \(sections regenerated alone since say so[^)]*\))?\."
)
"""The header's date sentence, with the note a regeneration of single sections adds to it."""


def _splice(path: Path, sections: list[tuple[str, Any]], only: list[str]) -> int:
    """Regenerate the chosen sections inside an existing report (new ones go where they
    belong in the section order); every other section stays byte for byte. A regenerated
    section says it was regenerated alone, and when; the header's date (that of the whole
    report) says that some sections are newer and the newest date, so no date is stale."""
    text = path.read_text()
    head, *parts = text.split("\n## ")
    existing = {p.split("\n", 1)[0]: p for p in parts}
    today = time.strftime("%Y-%m-%d")
    out = []
    for title, make in sections:
        if any(o in title for o in only):
            note = f"*Regenerated alone (`python -m bench.report --only`) on {today}.*"
            out.append(f"{title}\n\n{note}\n\n{make()}\n")
            print(f"regenerated: {title}")
        elif title in existing:
            out.append(existing[title])
    head = _GENERATED.sub(
        lambda m: f"{m.group(1)} (sections regenerated alone since say so, the latest on {today}).",
        head,
        count=1,
    )
    path.write_text("\n## ".join([head, *out]).rstrip("\n") + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-service", action="store_true")
    p.add_argument("--out", default=str(ROOT / "docs"))
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TITLE",
        help="regenerate only the sections whose title contains TITLE (repeatable), in the "
        "existing report, leaving the others as they were",
    )
    args = p.parse_args(argv)
    docs = Path(args.out)
    figs = docs / "report"
    figs.mkdir(parents=True, exist_ok=True)
    n = 20_000 if args.quick else 200_000
    q = args.quick
    sections: list[tuple[str, Any]] = [
        ("Accuracy after k relaxation steps", lambda: accuracy(figs, n // 2, 10 if q else 20)),
        (
            "Many independent releases vs lossless (Andersson et al., Fig. 2)",
            lambda: andersson_fig2(figs, n),
        ),
        (
            "Sample paths of the Laplace process (Koufogiannis et al., Fig. 1)",
            lambda: sample_paths(figs),
        ),
        (
            "Conditional law of V2 given V1 (Koufogiannis et al., Fig. 3)",
            lambda: conditional(figs, n * 5),
        ),
        ("Exact counts: discrete Laplace gradual release", lambda: discrete_laplace(figs, n)),
        ("Running totals: continual counting through the tree", lambda: running_totals(figs, q)),
        ("Sparse histograms: time per round against the domain size", lambda: histograms(figs, q)),
        (
            "Histogram streams: keys above a threshold, bought step by step",
            lambda: histogram_stream(figs, q),
        ),
        ("Factorization mechanism: prefix sums", lambda: factorization(figs)),
        ("RAPPOR with relaxable parameters", lambda: rappor(figs, q)),
        ("Per-recipient levels in a social network: collusion", lambda: social(figs, q)),
        ("Speed of the samplers against numpy (same run)", lambda: speed(q)),
        (
            "Noise per coordinate against numpy and OpenDP's exact samplers (same run)",
            lambda: exact_speed(q),
        ),
        (
            "Noise per call at 8 numbers, the service's size, against numpy and OpenDP (same run)",
            lambda: small_speed(q),
        ),
        ("Speed of histogram releases against the library (same run)", lambda: histogram_speed(q)),
        ("Market core per event against its cryptographic floor (same run)", lambda: core_cost(q)),
        ("Service throughput and latency (same broker)", lambda: service(q)),
    ]
    if args.only:
        return _splice(docs / "report.md", sections, args.only)
    if args.no_service:
        sections = sections[:-1]
    body = [
        "# Results report",
        "",
        "Generated by `python -m bench.report` on a 2-core machine"
        + (" (quick mode: small samples)" if args.quick else "")
        + f", {time.strftime('%Y-%m-%d')}. Every ratio is against a baseline measured in the "
        "same run. Goals are stated against floors of the same run (issue #42; "
        "[operations.md](operations.md#goals-against-the-floors-42)): the market core against "
        "its crypto floor, the worker against the transport floor (raw aiokafka), the noise "
        "against numpy's inexact samplers and OpenDP's exact ones. Methods and derivations: "
        "[math.md](math.md).",
    ]
    for title, make in sections:
        body += ["", f"## {title}", "", make()]
    (docs / "report.md").write_text("\n".join(body) + "\n")
    print(f"wrote {docs / 'report.md'} and {len(list(figs.glob('*.png')))} figures in {figs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
