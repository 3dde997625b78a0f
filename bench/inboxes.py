"""v1 against v2 inboxes (docs/protocol.md §8.5): what a purchase and a batch's deliveries cost
the market core, in records, signatures and CPU, in the same run.

Run ``python -m bench.inboxes`` (``--quick`` for a smoke run). Two cores on plain dict stores,
one per inbox layout, with the same sealed seller, buyers, streams and signed requests; the
runs alternate between them, so the machine's load moves both alike. Per event it gives:

* **inbox records**: records written to inboxes (v1: one per message on ``<p>.inbox.<id>``;
  v2: one per account and event on ``<p>.inbox``), and all records out;
* **signatures**: Ed25519 signatures the core makes (libsodium's ``crypto_sign``, counted);
* **CPU µs**: this thread's CPU time per event, and the ratio v2 / v1 (the figure to read:
  absolute times move with the machine, whose load average the last line gives). The floor
  of ``python -m bench.core`` is the same for both layouts but for the signatures and seals
  counted here.

``--service`` measures the same on the embedded broker: one worker per layout, both running,
the same sealed parties and streams in each, rounds of concurrent purchases alternating between
the two markets. Per purchase: records and bytes the market produced (:mod:`bench.produced`,
by topic kind), and the worker's and the broker's CPU (``/proc``), less what each spent idle
at the same rate over the round's time (measured before the rounds); v2/v1 is the figure to
read, with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import nacl.bindings

from bench.service import BENCH_KEYS, STEPS, _purchase, _registration, bench_market, sealed_batch
from streams.clients.client import now_ms
from streams.clients.keys import Party
from streams.core import MarketCore, Stores
from streams.core.context import Limits
from streams.core.outputs import Outcome, Output
from streams.wire.events import StreamRegistration
from streams.wire.topics import Topics

MARKET = "benchinbox"
RETAINED = 4
HOLDERS = 8
SELLER = Party.generate("seller")


@dataclass
class Path:
    """One layout's events, signed beforehand: purchases, then value batches to holders."""

    layout: str
    core: MarketCore
    topics: Topics
    purchases: list[bytes]
    values: list[bytes]


@dataclass
class Figures:
    records: float
    inbox_records: float
    signatures: float
    cpu_us: float


def _values(stream: str, start: int, count: int) -> bytes:
    batch = sealed_batch(
        SELLER,
        MARKET,
        stream_id=stream,
        seller_id=SELLER.account_id,
        items=[
            {"value_id": f"v{j:07d}", "values": [1.0] * 8, "published_at_ms": now_ms()}
            for j in range(start, start + count)
        ],
    )
    return batch.model_dump_json().encode()


def _check(out: Outcome, status: str) -> None:
    if out.status != status:  # a benchmark that times rejections measures nothing
        raise RuntimeError(f"expected {status}, got {out.status}: {out.reason}")


def prepare(inboxes: int, n_streams: int, buyers: list[Party]) -> Path:
    """A core with v``inboxes`` inboxes: ``n_streams`` streams of :data:`RETAINED` values,
    ``buyers`` open; the next steps of every stream to buy, and batches of one value each to
    the stream ``subs`` whose :data:`HOLDERS` holders receive them."""
    t = Topics(MARKET, 4, inboxes, 16)
    core = MarketCore(Stores(), BENCH_KEYS, t, limits=Limits(max_streams_per_seller=4096))
    for who in (SELLER, *buyers):
        opening = who.open_account(bench_market(MARKET)).model_dump_json().encode()
        _check(core.handle(t.accounts, opening), "accepted")
    levels = [round(0.25 * (k + 1), 2) for k in range(STEPS)]
    for s in [f"p{i}" for i in range(n_streams)] + ["subs"]:
        reg = SELLER.sign(
            StreamRegistration,
            bench_market(MARKET),
            seller_id=SELLER.account_id,
            **_registration(s, levels, levels[-1]),
        )
        _check(core.handle(t.registrations, reg.model_dump_json().encode()), "accepted")
        _check(core.handle(t.values, _values(s, 0, RETAINED)), "accepted")
    for holder in buyers[:HOLDERS]:
        _check(core.handle(t.purchases, _purchase(MARKET, holder, "subs", 0)), "fulfilled")
    buys = [
        _purchase(MARKET, buyers[(k * n_streams + s) % len(buyers)], f"p{s}", k)
        for k in range(STEPS)
        for s in range(n_streams)
    ]
    vals = [_values("subs", RETAINED + i, 1) for i in range(100)]
    return Path(f"v{inboxes}", core, t, buys, vals)


def _counted(run: Callable[[], list[Output]], events: int, t: Topics) -> Figures:
    """Records and signatures per event of one untimed call of ``run``."""
    signed = [0]
    real = nacl.bindings.crypto_sign

    def counting(message: bytes, sk: bytes) -> bytes:
        signed[0] += 1
        return real(message, sk)

    nacl.bindings.crypto_sign = counting
    try:
        outs = run()
    finally:
        nacl.bindings.crypto_sign = real
    inbox = sum(1 for o in outs if t.is_inbox(o.topic) or o.topic == t.shared_inbox)
    return Figures(len(outs) / events, inbox / events, signed[0] / events, 0.0)


def _timed(run: Callable[[], list[Output]], events: int) -> float:
    t0 = time.thread_time()
    run()
    return (time.thread_time() - t0) / events * 1e6


def _batch(p: Path, topic: str, raws: list[bytes], status: str) -> Callable[[], list[Output]]:
    """One core batch handling ``raws`` from ``topic``, each checked to end ``status``: the
    outputs, the batch's deliveries included."""

    def run() -> list[Output]:
        outs: list[Output] = []
        with p.core.batch() as deliveries:
            for raw in raws:
                out = p.core.handle(topic, raw)
                _check(out, status)
                outs += out.outputs
        return outs + list(deliveries)

    return run


def measure(n_streams: int, runs: int) -> dict[tuple[str, str], list[Figures]]:
    """Per (event kind, layout): the counted figures once, then CPU µs per run, interleaved."""
    buyers = [Party.generate(f"buyer{i}") for i in range(64)]
    paths = [prepare(v, n_streams, buyers) for v in (1, 2)]
    chunk = len(paths[0].purchases) // (runs + 1)
    out: dict[tuple[str, str], list[Figures]] = {}
    for i in range(runs + 1):  # the first run counts; the others are timed
        for p in paths:
            buys = p.purchases[i * chunk : (i + 1) * chunk]
            vals = p.values[i * 10 : (i + 1) * 10]
            for kind, run, n in (
                ("purchase", _batch(p, p.topics.purchases, buys, "fulfilled"), len(buys)),
                ("value to 8 holders", _batch(p, p.topics.values, vals, "accepted"), len(vals)),
            ):
                got = out.setdefault((kind, p.layout), [])
                if i == 0:
                    got.append(_counted(run, n, p.topics))
                else:
                    got.append(Figures(0, 0, 0, _timed(run, n)))
    return out


def render(results: dict[tuple[str, str], list[Figures]]) -> str:
    lines = [
        "| event | inboxes | records out | inbox records | signatures | CPU µs (median) | v2/v1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for (kind, layout), figs in results.items():
        counted, timed = figs[0], [f.cpu_us for f in figs[1:]]
        base = statistics.median(f.cpu_us for f in results[(kind, "v1")][1:])
        ratio = statistics.median(timed) / base
        lines.append(
            f"| {kind} | {layout} | {counted.records:.2f} | {counted.inbox_records:.2f} | "
            f"{counted.signatures:.2f} | {statistics.median(timed):.0f} | {ratio:.2f} |"
        )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines.append(f"\nload average {load}; {len(timed)} timed runs per row, interleaved")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inboxes", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few events")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--service", action="store_true", help="on the embedded broker")
    args = parser.parse_args(argv)
    streams, runs = (4, 2) if args.quick else (64, args.runs)
    if args.service:
        from bench.inboxes_service import service

        print(service(4 if args.quick else 16, runs))
        return 0
    print(render(measure(streams, runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
