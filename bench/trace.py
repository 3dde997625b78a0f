"""Event-path trace: how deep and how wide one value and one purchase run through the code.

Run ``python -m bench.trace``. A timing benchmark (``bench.core``) says what an event costs;
it cannot say whether the path is readable. This tool counts instead, so a restructure of
``streams/core`` can be compared before and after on numbers that do not move with the
machine: one value batch (one value, a stream with two holders) and one purchase (the next
step of a stream whose window holds 4 values, sealed to the buyer, with a receipt), each
handed to :meth:`MarketCore.handle <streams.core.MarketCore.handle>` under
:func:`sys.setprofile`. Only frames whose code lives in the ``streams`` and ``market`` packages
are counted:

* **calls** — Python frames started (functions, lambdas, comprehensions, generator resumes);
* **modules** — distinct modules in which at least one call ran;
* **entries** — calls whose nearest *project* caller is in another module (or, for the first
  call, in none): how often the path crosses a module boundary. Library frames in between
  (pydantic, contextlib, functools) are looked through, so a project callback run by pydantic
  is entered from the project module that called pydantic;
* **depth** — the most project frames ever on the stack at once.

Only the core's constructor and ``handle`` are used (accounts, streams and purchases go in as
signed events, as a worker hands them in), so the tool measures any layout of ``streams/core``
that keeps that API. Every key, id, timestamp and the noise secret are fixed and the clock is
stopped, so two runs print the same numbers. Both events are traced in the market's steady
state, not on first use: the value's window is full (it evicts one, as every value does in a
running market) and the purchase is the buyer's third step (the first draws the window's noise
from scratch and sets up the buyer's sealing key). The tool then traces each event's twin (the
next value, the next step) and warns if its path differs: the warm-up no longer reaches the
steady state.
"""

from __future__ import annotations

import gc
import hashlib
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import market
import streams
from streams.clients.keys import Party
from streams.core import MarketCore, MarketKeys, Stores
from streams.wire.events import PurchaseRequest, StreamRegistration, ValueBatch
from streams.wire.sealing import seal_values
from streams.wire.signing import MarketRef
from streams.wire.topics import Topics

MARKET = "benchtrace"
NOW_MS = 1_000
"""The stopped clock, and every event's timestamp: no horizon or expiry depends on the run."""
DIM = 8
STEPS = [round(0.25 * (k + 1), 2) for k in range(16)]
"""The purchase stream's schedule, as ``bench.core``'s: the traced purchase buys step 3."""
RETAINED = 4
PACKAGES = {Path(str(p.__file__)).resolve().parent: p.__name__ for p in (streams, market)}
"""Where project code lives: the ``streams`` and ``market`` packages, wherever installed."""


def party(name: str, *, sealing: bool) -> Party:
    """A party whose keys are a function of its name (fixed signatures, fixed sealing)."""
    seed = hashlib.sha256(name.encode()).digest()
    box = X25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest()) if sealing else None
    return Party(name, Ed25519PrivateKey.from_private_bytes(seed), box)


SELLER = party("seller", sealing=False)
HOLDERS = [party(f"holder{i}", sealing=False) for i in range(2)]
BUYER = party("buyer", sealing=True)


# -- the trace ----------------------------------------------------------------------------------
@dataclass
class Trace:
    """What one event's path did in project code, per module: the numbers to compare.

    Attributes
    ----------
    calls : Counter[str]
        Project frames started, by module.
    entries : Counter[str]
        Of those, the calls whose nearest project caller is in another module (or none).
    depth : int
        The most project frames on the stack at once.
    """

    calls: Counter[str] = field(default_factory=Counter)
    entries: Counter[str] = field(default_factory=Counter)
    depth: int = 0


def module_of(code: CodeType, cache: dict[CodeType, str | None]) -> str | None:
    """The dotted module name of ``code`` if it is project code, else None.

    Parameters
    ----------
    code : CodeType
        A frame's code: its file says where it lives.
    cache : dict[CodeType, str | None]
        Answers so far; the profile hook runs on every call, project or not, and resolving a
        path each time would make tracing slow.
    """
    if code in cache:
        return cache[code]
    name = None
    path = Path(code.co_filename)
    if path.suffix == ".py":
        path = path.resolve()
        for root, package in PACKAGES.items():
            if path.is_relative_to(root):
                parts = [package, *path.relative_to(root).with_suffix("").parts]
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    cache[code] = name
    return name


@contextmanager
def traced() -> Iterator[Trace]:
    """Count the project frames started inside the block (see the module docstring).

    The garbage collector is off meanwhile: a collection run inside the event would call
    finalisers that are not the event's, and at a moment that varies between runs.
    """
    trace = Trace()
    cache: dict[CodeType, str | None] = {}

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or (here := module_of(frame.f_code, cache)) is None:
            return
        depth, caller, back = 1, None, frame.f_back
        while back is not None:
            if (mod := module_of(back.f_code, cache)) is not None:
                depth += 1
                caller = caller or mod
            back = back.f_back
        trace.calls[here] += 1
        trace.entries[here] += caller != here
        trace.depth = max(trace.depth, depth)

    gc.collect()
    gc.disable()
    sys.setprofile(hook)
    try:
        yield trace
    finally:
        sys.setprofile(None)
        gc.enable()


# -- the market ---------------------------------------------------------------------------------
def _send(core: MarketCore, topic: str, raw: bytes, status: str) -> None:
    """Hand one event to the core; a refused event would trace the rejection path instead."""
    out = core.handle(topic, raw)
    if out.status != status:
        raise RuntimeError(f"expected {status}, got {out.status}: {out.reason}")


KEYS = MarketKeys(
    signing_key=Ed25519PrivateKey.from_private_bytes(bytes(range(32))), noise_secret=b"n" * 32
)
"""The traced market's keys (sellers seal their values to it)."""
SIGNED_FOR = MarketRef(MARKET, KEYS.key_id)
"""What the traced parties sign for."""


def _value(stream: str, i: int) -> bytes:
    """A signed batch of one value of :data:`DIM` numbers (its id ``v{i}``)."""
    item = {"value_id": f"v{i}", "values": [20.0 + i] * DIM, "published_at_ms": NOW_MS}
    clear = SELLER.sign(
        ValueBatch, SIGNED_FOR, stream_id=stream, seller_id=SELLER.account_id, items=[item]
    )
    sealed = seal_values(clear, MARKET, KEYS.sealing_public_b64)  # as a client sends it
    fields = sealed.model_dump(exclude={"key_id", "signature"})
    batch = SELLER.sign(ValueBatch, SIGNED_FOR, **fields)
    return batch.model_dump_json().encode()


def _purchase(stream: str, buyer: Party, pid: str) -> bytes:
    """A signed purchase of the next step (no level named), at any price below 10,000 EUR."""
    req = buyer.sign(
        PurchaseRequest,
        SIGNED_FOR,
        purchase_id=pid,
        buyer_id=buyer.account_id,
        stream_id=stream,
        max_price_minor=10**6,
        requested_at_ms=NOW_MS,
    )
    return req.model_dump_json().encode()


def _register(core: MarketCore, t: Topics, stream: str, steps: list[float]) -> None:
    """Register a Laplace stream of :data:`DIM` numbers keeping :data:`RETAINED` values."""
    reg = SELLER.sign(
        StreamRegistration,
        SIGNED_FOR,
        stream_id=stream,
        seller_id=SELLER.account_id,
        mechanism="laplace",
        sensitivity=1.0,
        dimension=DIM,
        steps=steps,
        cap=steps[-1],
        retain_last=RETAINED,
        pricing={"kind": "linear_level", "rate_per_level": 100},
        currency="EUR",
    )
    _send(core, t.registrations, reg.model_dump_json().encode(), "accepted")


def market_core() -> tuple[MarketCore, Topics]:
    """A core on dict stores with the parties' accounts open and three streams registered:
    ``v`` (for values) and ``p`` and ``w`` (4 values in their windows, for purchases)."""
    t = Topics(MARKET)
    core = MarketCore(Stores(), KEYS, t, clock=lambda: NOW_MS)
    for who in (SELLER, *HOLDERS, BUYER):
        _send(
            core,
            t.accounts,
            who.open_account(SIGNED_FOR, opened_at_ms=NOW_MS).model_dump_json().encode(),
            "accepted",
        )
    _register(core, t, "v", [0.5, 1.0])
    for stream in ("p", "w"):
        _register(core, t, stream, STEPS)
        for i in range(RETAINED):
            _send(core, t.values, _value(stream, i), "accepted")
    return core, t


@dataclass(frozen=True)
class Event:
    """A traced event and its twin, signed beforehand (signing is not the core's work).

    Attributes
    ----------
    name : str
        What the event is, as the table's heading says it.
    topic : str
        The input topic it goes to.
    raw : bytes
        The traced event.
    twin : bytes
        The same kind of event next in line (the next value, the next step): traced too, to
        check that the warm-up reached the steady state.
    status : str
        The outcome the event must have; anything else would trace a rejection.
    """

    name: str
    topic: str
    raw: bytes
    twin: bytes
    status: str


def events() -> tuple[MarketCore, list[Event]]:
    """The market in its steady state and the two events to trace there.

    Warm-up: the holders' first purchases, then values until the window is full and a value
    evicts one (as every value does in a running market). The buyer buys two steps of ``p``
    (the first draws the window's noise from scratch) and, before, the first four steps of
    ``w``, a stream on the same schedule: the error model of a level is computed once per
    process (an ``lru_cache`` in ``streams.core.accuracy``), and a market with many streams on
    a few schedules finds it there; the traced step and its twin find it too.
    """
    core, t = market_core()
    _send(core, t.values, _value("v", 0), "accepted")
    for holder in HOLDERS:
        _send(core, t.purchases, _purchase("v", holder, "v-0"), "fulfilled")
    for i in range(1, RETAINED + 1):
        _send(core, t.values, _value("v", i), "accepted")
    for stream, steps in (("w", 4), ("p", 2)):
        for k in range(steps):
            _send(core, t.purchases, _purchase(stream, BUYER, f"{stream}-{k}"), "fulfilled")
    n = RETAINED + 1
    return core, [
        Event(
            "value (1 value of 8 numbers, 2 holders, evicts 1)",
            t.values,
            _value("v", n),
            _value("v", n + 1),
            "accepted",
        ),
        Event(
            "purchase (step 3 of 16, 4 values in the window, sealed, receipt)",
            t.purchases,
            _purchase("p", BUYER, "p-2"),
            _purchase("p", BUYER, "p-3"),
            "fulfilled",
        ),
    ]


def trace_one(core: MarketCore, topic: str, raw: bytes, status: str) -> Trace:
    """The trace of ``core.handle(topic, raw)`` alone.

    Parameters
    ----------
    core : MarketCore
        The warmed-up core.
    topic, raw : str, bytes
        The event, its topic name resolved by the caller (``Topics`` is project code: resolving
        it inside the trace would count the tool's own calls).
    status : str
        The expected outcome; another one raises ``RuntimeError``.
    """
    with traced() as seen:
        out = core.handle(topic, raw)
    if out.status != status:
        raise RuntimeError(f"expected {status}, got {out.status}: {out.reason}")
    return seen


# -- the report ---------------------------------------------------------------------------------
def render(name: str, trace: Trace) -> str:
    """One event's markdown table (modules in name order, so two runs diff line by line) and
    its summary line."""
    lines = [f"### {name}", "", "| module | entries | calls |", "|---|---:|---:|"]
    for mod in sorted(trace.calls):
        lines.append(f"| {mod} | {trace.entries[mod]} | {trace.calls[mod]} |")
    lines += ["", summary(trace), ""]
    return "\n".join(lines)


def summary(trace: Trace) -> str:
    """The line to quote in an issue note: calls, modules, entries, depth."""
    calls, entries = sum(trace.calls.values()), sum(trace.entries.values())
    return f"calls {calls}, modules {len(trace.calls)}, entries {entries}, depth {trace.depth}"


def main() -> int:
    """Trace each event once and print its table; then trace its twin, and warn if the twin's
    path differs (the warm-up no longer reaches the steady state the numbers are meant for)."""
    core, todo = events()
    for ev in todo:
        first = trace_one(core, ev.topic, ev.raw, ev.status)
        print(render(ev.name, first))
        twin = trace_one(core, ev.topic, ev.twin, ev.status)
        if (twin.calls, twin.entries, twin.depth) != (first.calls, first.entries, first.depth):
            print(
                f"warning: the next {ev.name.split()[0]} differs: {summary(twin)}", file=sys.stderr
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
