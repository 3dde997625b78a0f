"""How every command prints: lines a person reads by default, JSON for machines with ``--json``.

One convention for every command:

* by default stdout holds what a person reads: one line, or a table, with units (the level's
  unit, prices with their currency, accuracy in the value's units);
* with ``--json`` (before or after the command's name) stdout holds only JSON, the machine's
  form (the market's events as the schemas in ``docs/schemas`` define them), and the lines a
  person reads go to stderr;
* an error is one line on stderr (:class:`~.common.CommandError`), whatever the mode.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from ...wire.times import utc_text

__all__ = [
    "accuracy",
    "add_json_flag",
    "event",
    "json_mode",
    "level",
    "money",
    "number",
    "offers_table",
    "one_value",
    "prices",
    "print_json",
    "progress",
    "published",
    "quote_line",
    "registered",
    "releases",
    "say",
    "share",
    "show",
    "warn",
]

JSON_HELP = "machine-readable JSON on stdout (the lines a person reads go to stderr)"


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """``--json`` after a command's name (``epsilon-market --json CMD`` works as well)."""
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP)


def json_mode(args: argparse.Namespace) -> bool:
    """Whether the command prints JSON (``--json`` given before or after its name)."""
    return bool(getattr(args, "json", False))


def print_json(obj: Any) -> None:
    """``obj`` (a pydantic model, or plain data) as indented JSON on stdout."""
    if hasattr(obj, "model_dump_json"):
        print(obj.model_dump_json(indent=2))
    else:
        print(json.dumps(obj, indent=2, sort_keys=True))


def warn(message: str) -> None:
    """A line for the person on stderr: a warning, or the human form under ``--json``."""
    print(message, file=sys.stderr)


def say(args: argparse.Namespace, text: str) -> None:
    """Lines a person reads: on stdout, or on stderr under ``--json`` (stdout holds JSON)."""
    if json_mode(args):
        warn(text)
    else:
        print(text, flush=True)


def show(args: argparse.Namespace, machine: Any, text: str) -> None:
    """A command's result: ``text`` for a person, or ``machine`` as JSON under ``--json`` (the
    text then goes to stderr)."""
    if json_mode(args):
        print_json(machine)
    say(args, text)


# -- numbers, levels, money ------------------------------------------------------------------
SHOWN_NUMBERS = 8
"""How many numbers of one value a line shows (``--json`` has them all)."""


def number(x: float) -> str:
    """A released number as a person reads it: a whole number as one (``12``, not ``12.0``:
    counts streams release integers), any other with six significant digits."""
    if math.isfinite(x) and x == math.floor(x) and abs(x) < 2.0**53:
        return str(int(x))
    return f"{x:.6g}"


def level(value: float, unit: str) -> str:
    """``0.5 epsilon``: a level always with its unit (ε, ρ or ω, spelled out)."""
    return f"{value:g} {unit}"


def money(minor: int, currency: str) -> str:
    """``50, "EUR"`` → ``0.50 EUR``."""
    from ...wire.money import format_money  # noqa: PLC0415

    return format_money(minor, currency)


def prices(entry: Any) -> str:
    """A catalog entry's levels for sale with their prices: ``0.5 epsilon (0.50 EUR), ...``."""
    reg = entry.registration
    return ", ".join(
        f"{level(p.level, entry.level_unit)} ({money(p.price_minor, reg.currency)})"
        for p in entry.prices
    )


def share(reg: Any) -> str:
    """A stream's per-buyer share in words (empty without one): ``; each buyer at most 25 %
    of the caps``."""
    if getattr(reg, "buyer_share", None) is None:
        return ""
    caps = "the cap and of each window's cap" if reg.window else "the cap"
    return f"; each buyer at most {reg.buyer_share * 100:g} % of {caps}"


# -- what the market answered -------------------------------------------------------------
def registered(entry: Any) -> str:
    """The lines saying a registration was accepted: what is sold, at which prices."""
    from ...wire.products import section_of  # noqa: PLC0415

    reg = entry.registration
    product = section_of(reg).noun
    privacy = (
        f", at most {reg.window.cap:g} {entry.level_unit} per "
        f"{reg.window.duration_ms / 1000:g} s window"
        if reg.window
        else ""
    )
    return (
        f"registered stream {reg.stream_id!r} of {reg.seller_id}: {product}, {reg.mechanism}, "
        f"dimension {reg.dimension}, sensitivity {reg.sensitivity:g}{privacy}{share(reg)}\n"
        f"  for sale: {prices(entry)}; cap {level(reg.cap, entry.level_unit)}\n"
        f"  signed by the market key {entry.market_key_id}; --json for the catalog entry"
    )


def accuracy(model: Any) -> str:
    """One line on the noise of every released number: its scale, RMS error and 95 % interval,
    in the value's units."""
    if model is None:
        return "  noise: not stated by the market"
    names = {
        "laplace": "Laplace scale",
        "discrete_laplace": "discrete Laplace scale",
        "gaussian": "Gaussian σ",
        "poisson": "Poisson λ",
    }
    hw = model.half_widths.get("95", math.nan)
    text = (
        f"  noise: {names.get(model.mechanism, 'scale')} {model.scale:.4g}; each number's "
        f"RMS error {model.std:.4g}, ±{hw:.4g} at 95 %"
    )
    if model.offset:
        text += f"; subtract the offset {number(model.offset)} for an unbiased estimate"
    if model.threshold is not None:
        text += f"; keys shown above the threshold {model.threshold:.4g}"
    rr = getattr(model, "randomized_response", None)
    if rr is not None:
        text = (
            f"  bits: randomized response, P(1 | 0) = {rr.p_if_0:.4g}, P(1 | 1) = "
            f"{rr.p_if_1:.4g} (RAPPOR's f = {rr.f:.4g})"
        )
    return text


def estimate(items: list[Any], model: Any) -> list[str]:
    """On RAPPOR bits: each bit's population frequency with its 95 % interval, from these
    releases alone (:func:`market.rappor.estimate_bits`; more values, a tighter interval)."""
    rr = getattr(model, "randomized_response", None)
    if rr is None or not items:
        return []
    from market.rappor import MarketResponse, estimate_bits  # noqa: PLC0415 - scipy, on demand

    est = estimate_bits(
        [r.values for r in items], MarketResponse(rr.p_if_0, rr.p_if_1, rr.f), confidence=0.95
    )
    cells = [
        f"{i}: {f:.2f} [{lo:.2f}, {hi:.2f}]"
        for i, (f, lo, hi) in enumerate(zip(est.fraction, est.low, est.high, strict=True))
    ]
    more = len(cells) - SHOWN_NUMBERS
    tail = f" … (+{more} more; streams.clients.rappor.frequencies)" if more > 0 else ""
    return [
        f"  frequency per bit, 95 % ({est.reports} reports): "
        + ", ".join(cells[:SHOWN_NUMBERS])
        + tail
    ]


def releases(items: list[Any], model: Any) -> list[str]:
    """One line per released value (its numbers, or a histogram's keys with their counts),
    then the noise they carry."""
    out = []
    for r in items:
        if r.keys is not None:
            pairs = [f"{k}: {number(v)}" for k, v in zip(r.keys, r.values, strict=True)]
            body = f"{len(pairs)} keys  " + ", ".join(pairs[:SHOWN_NUMBERS])
            more = len(pairs) - SHOWN_NUMBERS
        else:
            body = " ".join(number(v) for v in r.values[:SHOWN_NUMBERS])
            more = len(r.values) - SHOWN_NUMBERS
        terms = f" (sum of {r.terms} tree nodes)" if getattr(r, "terms", None) else ""
        tail = f" … (+{more} more; --json for all)" if more > 0 else ""
        out.append(f"  {r.value_id:<16} {body}{tail}{terms}")
    if items:
        out.append(accuracy(model))
    return out + estimate(items, model)


def _count(ev: Any) -> str:
    """How many values a release event shows: "sealed" while its envelope is not opened."""
    return "sealed" if ev.sealed is not None and not ev.releases else str(len(ev.releases))


def _sold(ev: Any) -> str:
    """One sale (a ``sale`` message, or an item of a ``sales`` notice), for its seller."""
    return (
        f"sold {ev.stream_id} to buyer {ev.buyer_ref[:16]}: level {ev.level_before:g} -> "
        f"{level(ev.level_after, ev.level_unit)} for {money(ev.price_minor, ev.currency)}"
        f", {ev.value_count} values"
    )


def event(ev: Any) -> list[str]:
    """The lines a person reads for one event of an inbox (``tail``)."""
    kind = getattr(ev, "type", "")
    if kind == "account":
        return [f"account {ev.account_id}: open, keys version {ev.version} (key id {ev.key_id})"]
    if kind == "values_accepted":
        said = ", ".join(
            f"{o.value_id} {o.status}" + (f" ({o.reason})" if o.reason else "") for o in ev.outcomes
        )
        return [f"values of {ev.stream_id}: {said}"]
    if kind == "purchase_fulfilled":
        head = (
            f"bought {ev.stream_id} at level {level(ev.level_after, ev.level_unit)} (from "
            f"{ev.level_before:g}) for {money(ev.price_minor, ev.currency)}, purchase "
            f"{ev.purchase_id}: {_count(ev)} values"
        )
        return [head, *releases(ev.releases, ev.error_model)]
    if kind == "value_released":
        head = f"new values of {ev.stream_id} at your level: {_count(ev)}"
        return [head, *releases(ev.releases, ev.error_model)]
    if kind == "quote":
        return [
            f"quote {ev.quote_id} on {ev.stream_id}: level {ev.level_before:g} -> "
            f"{level(ev.level_after, ev.level_unit)} costs "
            f"{money(ev.price_minor, ev.currency)}"
        ]
    if kind == "reservation":
        return [
            f"reserved {ev.reservation_id} on {ev.stream_id}: level {ev.level_before:g} -> "
            f"{level(ev.level_after, ev.level_unit)} for {money(ev.price_minor, ev.currency)}, "
            f"until {utc_text(ev.expires_at_ms)}"
        ]
    if kind == "sale":
        return [_sold(ev)]
    if kind == "sales":  # a batch's notice: a line per sale, as the one-sale message reads
        return [_sold(one) for one in ev.sales]
    if kind == "deliveries_withheld":
        return [
            f"withheld from you on {ev.stream_id}: {len(ev.value_ids)} value(s) "
            f"({ev.reason}): {ev.message}"
        ]
    if kind == "rejection":
        what = " ".join(
            x for x in (ev.source_topic.rsplit(".", 1)[-1], ev.stream_id, ev.request_id) if x
        )
        return [f"refused ({ev.reason}) {what}: {ev.message}"]
    return [f"{kind or 'event'}: --json shows it"]


def quote_line(q: Any) -> str:
    """What a quote buys and costs; at or below the level held, that there is nothing to buy
    (and, at the top step, that nothing more is for sale)."""
    if q.level_after > q.level_before:
        return (
            f"level {q.level_before:g} -> {q.level_after:g} ({q.level_unit}) costs "
            f"{money(q.price_minor, q.currency)}"
        )
    held = f"you already hold level {level(q.level_before, q.level_unit)} of {q.stream_id}"
    above = sorted(o.level for o in q.offers if o.level > q.level_before)
    if not above:
        return f"{held}, the top level for sale: there is nothing more to buy"
    return (
        f"{held}, as accurate as this quote asks or more: nothing to buy; the next level for "
        f"sale is {above[0]:g} (--target {above[0]:g})"
    )


def offers_table(q: Any) -> str:
    """The levels for sale as a buyer reads them: accuracy in the value's units, price now."""
    lines = [
        f"{'level (' + q.level_unit + ')':<16} {'RMS error':>10} {'±95 %':>10} {'price now':>12}"
    ]
    for o in q.offers:
        price = "held" if o.held else money(o.price_minor, q.currency)
        mark = "  <- this quote" if o.level == q.level_after and not o.held else ""
        if o.fits_window is False and not o.held:
            mark += "  (over the privacy window's headroom now)"
        if getattr(o, "fits_share", None) is False and not o.held:
            mark += "  (over one buyer's share now)"
        lines.append(f"{o.level:<16g} {o.rmse:>10.4g} {o.half_width_95:>10.4g} {price:>12}{mark}")
    pw = getattr(q, "privacy_window", None)
    if pw is not None:
        lines.append(
            f"privacy window {utc_text(pw.start_ms)} – {utc_text(pw.end_ms)}: spent "
            f"{pw.spent:g} of {pw.cap:g} {pw.unit}, headroom {pw.headroom:g}"
        )
    return "\n".join(lines)


# -- publishing ---------------------------------------------------------------------------------
def _status(answer: Any, value_id: str) -> str:
    """What the market answered for one value: accepted, duplicate (the same numbers again),
    refused, or sent (not waited for)."""
    if answer is None:
        return "sent"
    lines = {o.value_id: o.status for o in getattr(answer, "outcomes", [])}
    status = lines.get(value_id, "rejected")
    return "refused" if status == "rejected" else status


def published(args: argparse.Namespace, client: Any, batch: Any, answer: Any) -> None:
    """Under ``--json``, one JSON line per value of a batch sent: its id, publication time
    (what a resend must carry) and the market's answer (``reason`` and ``message`` if refused)."""
    if not json_mode(args):
        return
    refusal = (
        {"reason": answer.reason, "message": answer.message}
        if (getattr(answer, "type", "") == "rejection")
        else {}
    )
    lines = {o.value_id: o for o in getattr(answer, "outcomes", [])}
    for item in batch.items:
        line = lines.get(item.value_id)
        why = {"reason": line.reason, "message": line.message} if line and line.reason else refusal
        row = {
            "value_id": item.value_id,
            "stream_id": batch.stream_id,
            "published_at_ms": client.published_at(batch.stream_id, item.value_id),
            "status": _status(answer, item.value_id),
            **why,
        }
        print(json.dumps(row, sort_keys=True), flush=True)


def one_value(client: Any, batch: Any, answer: Any) -> str:
    """The line for a single value published: its id, the answer, its publication time in UTC,
    and the flags that resend it as the same value (the time is part of its identity)."""
    vid = batch.items[0].value_id
    ms = client.published_at(batch.stream_id, vid)
    return (
        f"{vid} {_status(answer, vid)}, published at {utc_text(ms)} "
        f"(resend as --value-id {vid} --published-at {ms})"
    )


def progress(args: argparse.Namespace, text: str | None) -> None:
    """A progress line redrawn in place (stderr under ``--json``); ``None`` ends it."""
    stream = sys.stderr if json_mode(args) else sys.stdout
    print(
        "" if text is None else f"\r{text}",
        end="\n" if text is None else "",
        file=stream,
        flush=True,
    )
