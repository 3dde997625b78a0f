"""``register`` and ``publish``: a seller's commands, signed with its key file.

``publish`` waits for the market's answer by default and says which values were refused and
why (exit 1 if any was); ``--no-wait`` sends and returns, for bulk loads. Values read from a
file are sent in signed batches sized to fit the broker's message size, with a progress line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import TYPE_CHECKING, Any

from . import output
from .common import (
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    CommandError,
    floats,
    load_party,
    refused,
    run_client,
    warn,
)
from .flags import in_flags, input_problem
from .output import add_json_flag

if TYPE_CHECKING:  # resume imports asyncio: --help and keygen load nothing heavy
    from .resume import Run

__all__ = ["add_commands", "parse_row"]

"""Stopped by Ctrl-C (128 + SIGINT), as a shell reports it."""

Row = tuple[str | None, list[float] | dict[str, float], int | None]
ROW_HELP = (
    'expected a JSON list of numbers or {"value_id": "...", "values": [numbers], '
    '"published_at_ms": ms} (on a histogram stream {"value_id": "...", "counts": {key: count}})'
)


def _rate(text: str, currency: str, flag: str) -> float:
    """A price rate typed in major units, in minor units (it may have fractions of a cent)."""
    from decimal import Decimal, InvalidOperation  # noqa: PLC0415

    from ...wire.money import exponent  # noqa: PLC0415

    try:
        rate = Decimal(text)
    except InvalidOperation:
        raise CommandError(f"{flag} {text!r} is not an amount of {currency} (e.g. 1.00)") from None
    if not rate.is_finite() or rate < 0:
        raise CommandError(f"{flag} must be 0 or more, got {text!r}")
    return float(rate.scaleb(exponent(currency)))


def _pricing(args: argparse.Namespace) -> dict[str, Any]:
    from ...wire.money import parse_money  # noqa: PLC0415

    if args.price_table:
        prices = {}
        for item in args.price_table.split(","):
            lvl, _, price = item.partition("=")
            try:
                prices[lvl.strip()] = parse_money(price, args.currency)
            except ValueError as exc:
                raise CommandError(f"--price-table {item!r}: {exc}") from None
        return {"kind": "table", "prices": prices}
    if args.price_per_precision is not None:
        rate = _rate(args.price_per_precision, args.currency, "--price-per-precision")
        return {"kind": "linear_precision", "rate_per_precision": rate}
    rate = _rate(args.price_per_level, args.currency, "--price-per-level")
    return {"kind": "linear_level", "rate_per_level": rate}


_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str) -> int:
    """``90s``, ``15m``, ``1h``, ``7d`` (or plain milliseconds) → milliseconds."""
    text = text.strip()
    unit = _UNIT_MS.get(text[-1:], 1) if text[-1:].isalpha() else 1
    number = text[:-1] if text[-1:].isalpha() else text
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: write e.g. 90s, 15m, 1h or 7d"
        ) from None
    if text[-1:].isalpha() and text[-1:] not in _UNIT_MS:
        raise argparse.ArgumentTypeError(f"{text!r}: the unit is one of s, m, h, d")
    return round(value * unit)


def _privacy(args: argparse.Namespace) -> dict[str, Any]:
    """The registration's privacy unit: per value, or per window with a cap."""
    if args.privacy_window is None:
        if args.window_cap is not None:
            raise CommandError("--window-cap needs --privacy-window")
        return {}
    if args.window_cap is None:
        raise CommandError("--privacy-window needs --window-cap (the most one window may spend)")
    return {
        "privacy_unit": "window",
        "window": {"duration_ms": args.privacy_window, "cap": args.window_cap},
    }


def _product(args: argparse.Namespace) -> dict[str, Any]:
    """What the stream sells: its values, (``--running-totals H``) their running sums,
    (``--histogram strings|integers:N``) sparse histograms, or (``--rappor ONES``) members' bit
    reports as randomized responses (its sensitivity, unless given: ``2 × ONES``)."""
    chosen = [args.running_totals, args.histogram, args.rappor]
    if sum(x is not None for x in chosen) > 1:
        raise CommandError(
            "a stream sells one product: pass at most one of --running-totals, --histogram "
            "and --rappor"
        )
    if args.rappor is not None:
        own = {} if args.sensitivity is not None else {"sensitivity": 2.0 * args.rappor}
        return {"product": "rappor", "rappor_ones": args.rappor, **own}
    if args.running_totals is not None:
        return {"product": "running_totals", "tree_height": args.running_totals}
    if args.histogram is None:
        return {}
    space, _, size = args.histogram.partition(":")
    spec: dict[str, Any] = {"key_space": space, "false_keys": args.false_keys}
    if space == "integers":
        if not size.isdigit():
            raise CommandError("--histogram integers:N needs the number of keys N (the domain)")
        spec["domain_size"] = int(size)
    elif space != "strings" or size:
        raise CommandError(f"--histogram {args.histogram!r}: write strings or integers:N")
    return {"product": "histogram", "histogram": spec}


def cmd_register(args: argparse.Namespace) -> int:
    from pydantic import ValidationError  # noqa: PLC0415

    from ...wire.events import Rejection, StreamRegistration  # noqa: PLC0415

    party = load_party(args)
    product = _product(args)
    sensitivity = product.pop("sensitivity", 1.0 if args.sensitivity is None else args.sensitivity)
    fields = dict(
        stream_id=args.stream,
        seller_id=party.account_id,
        mechanism=args.mechanism,
        sensitivity=sensitivity,
        dimension=args.dimension,
        steps=args.steps,
        cap=args.cap if args.cap is not None else max(args.steps),
        retain_last=args.retain,
        sealed=args.sealed,
        pricing=_pricing(args),
        currency=args.currency,
        description=args.description,
        **_privacy(args),
        **product,
        **({} if args.buyer_share is None else {"buyer_share": args.buyer_share}),
    )
    try:
        StreamRegistration.model_validate(  # checked here; signed once the market key is read
            {**fields, "key_id": "0" * 16, "signature": "A" * 86 + "=="}
        )
    except ValidationError as exc:
        raise CommandError(f"invalid registration: {input_problem(args, exc)}") from None

    async def body(c: Any) -> Any:
        return await c.register(fields, timeout=args.timeout)

    result = run_client(args, body, party)
    if isinstance(result, Rejection):
        raise refused(args, "registration", result)
    output.show(args, result, output.registered(result))
    return 0


def parse_row(line: str) -> Row:
    """One line of a values file, checked before anything is sent."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON ({exc}); {ROW_HELP}") from None
    vid = stamp = None
    if isinstance(obj, dict):
        vid, stamp = obj.get("value_id"), obj.get("published_at_ms")
        if vid is not None and not isinstance(vid, str):
            raise ValueError(f"value_id must be a string; {ROW_HELP}")
        if stamp is not None and (not isinstance(stamp, int) or isinstance(stamp, bool)):
            raise ValueError(f"published_at_ms must be an integer (Unix ms); {ROW_HELP}")
        if "counts" in obj:
            return vid, _counts(obj["counts"]), stamp
        obj = obj.get("values")
    if not isinstance(obj, list) or not obj:
        raise ValueError(ROW_HELP)
    if not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in obj
    ):
        raise ValueError(f"values must all be finite numbers; {ROW_HELP}")
    return vid, [float(x) for x in obj], stamp


def _counts(obj: Any) -> dict[str, float]:
    if not isinstance(obj, dict) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        for x in obj.values()
    ):
        raise ValueError(f"counts must be an object of finite numbers; {ROW_HELP}")
    return {str(k): float(x) for k, x in obj.items()}


def _rows(args: argparse.Namespace) -> list[Row]:
    if args.values is not None:
        return [(args.value_id, args.values, args.published_at)]
    if args.counts is not None:
        from ..histograms import read_counts  # noqa: PLC0415

        try:
            return [(args.value_id, read_counts(args.counts), args.published_at)]
        except OSError as exc:
            raise CommandError(f"cannot read {args.counts}: {exc.strerror}") from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    if args.file is None:
        raise CommandError(
            "publish needs --values 1,2,3, --counts FILE (one histogram: CSV key,count or a "
            "JSON object) or --file FILE (JSON lines; - = stdin)"
        )
    rows = []
    try:
        src = sys.stdin if args.file == "-" else open(args.file)  # noqa: SIM115
    except OSError as exc:
        raise CommandError(f"cannot read {args.file}: {exc.strerror}") from None
    with src:
        try:
            for n, raw_line in enumerate(src, 1):
                line = raw_line.strip()
                if line:
                    try:
                        rows.append(parse_row(line))
                    except ValueError as exc:
                        raise CommandError(f"line {n}: {exc}") from None
        except UnicodeDecodeError:
            raise CommandError(f"{args.file} is not text (UTF-8 JSON lines)") from None
    if not rows:
        raise CommandError(f"{args.file} holds no values")
    return rows


def cmd_publish(args: argparse.Namespace) -> int:
    party = load_party(args)
    rows, run = _skipped(args, _rows(args))
    per_batch = max(1, min(args.batch_size, 900_000 // (26 * max(len(r[1]) for r in rows) + 200)))

    async def body(c: Any) -> list[Any]:
        refused = []
        t0 = time.monotonic()
        c.market_sealing_key = args.market_sealing_key
        try:  # the numbers are sealed to the market's key: find it before sending anything
            c.market_sealing_key = c.market_sealing_key or await c.sealing_key_of(args.stream)
        except (LookupError, ValueError) as exc:
            raise CommandError(f"{exc} (or pass --market-sealing-key)") from None
        await c.signing_market()  # what every batch is signed for
        _check_counts(c.registration_of(args.stream), rows)
        last: tuple[Any, Any] = (None, None)

        def answered(batch: Any, answer: Any) -> None:
            nonlocal refused, last
            last = batch, answer
            refused += _refusals(answer, batch)
            output.published(args, c, batch, answer)
            if run.total > 1:
                rate = run.answered / max(1e-9, time.monotonic() - t0)
                done = run.skipped + run.answered
                output.progress(args, f"published {done}/{run.total} values ({rate:.0f}/s)")

        await run.send(0, _publish_rows(c, args, rows, per_batch, answered, run))
        if run.total > 1:
            output.progress(args, None)
        else:
            output.say(args, output.one_value(c, *last))
        return refused

    try:
        refused = run_client(args, body, party)
    except KeyboardInterrupt:  # a second Ctrl-C, or one before anything was sent
        output.progress(args, None)
        if args.file is not None:
            output.say(args, "\n".join(run.report(args)))
        raise
    for vid, reason, message in refused:
        warn(f"value {vid} refused ({reason}): {in_flags(args, message)}")
    if run.stopped and args.file is not None:  # one value given on the line was sent whole
        output.say(args, "\n".join(run.report(args)))
        return EXIT_INTERRUPTED
    return EXIT_REFUSED if refused else 0


async def _publish_rows(
    c: Any, args: argparse.Namespace, rows: list[Row], per_batch: int, answered: Any, run: Run
) -> None:
    """``rows`` through the client's batcher (:mod:`streams.clients.batching`), in order, up
    to ``per_batch`` values per batch and several batches in flight; ``answered`` is told of
    each batch's answer, ``run`` of the values answered in order and those in flight. Once Ctrl-C
    stopped ``run``, no value is added and those added are finished. Raises the error of a
    value that got no answer (TimeoutError)."""
    added = 0

    def told(batch: Any, answer: Any) -> None:
        run.answered, run.in_flight = batcher.answered, added - batcher.answered
        answered(batch, answer)

    async with c.batcher(
        args.stream,
        max_values=per_batch,
        max_delay=args.batch_delay,
        wait=not args.no_wait,
        timeout=args.timeout,
        on_answer=told,
    ) as batcher:
        lines = []
        for vid, values, at in rows:
            if run.stopped:
                break
            lines.append(await batcher.add(values, value_id=vid, published_at_ms=at))
            added += 1
            run.in_flight = added - run.answered
    for line in lines:
        line.result()


def _skipped(args: argparse.Namespace, rows: list[Row]) -> tuple[list[Row], Run]:
    """``rows`` after ``--skip N`` (the values of a ``--file`` already published), and the
    run that counts them."""
    from .resume import Run  # noqa: PLC0415

    if not args.skip:
        return rows, Run(len(rows))
    if args.file is None:
        raise CommandError("--skip N skips values of --file (a publish stopped by Ctrl-C)")
    if args.skip < 0:
        raise CommandError(f"--skip is a number of values, 0 or more; not {args.skip}")
    if args.skip >= len(rows):
        raise CommandError(
            f"--skip {args.skip}: {args.file} holds {len(rows)} values; skip fewer than that"
        )
    return rows[args.skip :], Run(len(rows), skipped=args.skip)


def _check_counts(reg: Any, rows: list[Row]) -> None:
    """On a counts stream the catalog showed, refuse a negative or fractional number before
    sending it (the market's rule: :mod:`streams.wire.counts`); unknown streams are the
    market's to answer."""
    from ...wire.counts import count_problem, sells_counts  # noqa: PLC0415
    from ...wire.products import section_of  # noqa: PLC0415

    if reg is None or not sells_counts(reg):
        return
    section = section_of(reg)
    product = f", {section.name}" if section.takes_counts else ""
    for n, (vid, values, _) in enumerate(rows, 1):
        numbers = list(values.values()) if isinstance(values, dict) else values
        bad = count_problem(numbers)
        if bad is not None:
            where = f"value {n}" + (f" ({vid})" if vid else "") if len(rows) > 1 else "the value"
            raise CommandError(
                f"{where}: number {bad[0] + 1} ({numbers[bad[0]]:g}) {bad[1]}: stream "
                f"{reg.stream_id!r} ({reg.mechanism}{product}) "
                "takes counts, whole numbers 0 or more; nothing was sent"
            )


def _refusals(answer: Any, batch: Any) -> list[tuple[str, str, str]]:
    from ...wire.events import Rejection  # noqa: PLC0415

    if answer is None:
        return []
    if isinstance(answer, Rejection):
        return [(i.value_id, answer.reason, answer.message) for i in batch.items]
    return [
        (o.value_id, o.reason or "", o.message or "")
        for o in answer.outcomes
        if o.status == "rejected"
    ]


def add_commands(sub: Any) -> None:
    sp = sub.add_parser("register", help="seller: register a stream (signed with --key-file)")
    sp.add_argument("--key-file", default=None, help="the seller's keys (epsilon-market keygen)")
    sp.add_argument("--stream", required=True, help="the new stream's id")
    sp.add_argument(
        "--mechanism",
        choices=["laplace", "gaussian", "poisson", "discrete_laplace"],
        default="laplace",
        help="discrete_laplace: exact whole-number releases of counts",
    )
    sp.add_argument(
        "--sensitivity",
        type=float,
        default=None,
        help="most one person changes one value, in the value's units (default 1; with "
        "--rappor ONES: 2 × ONES)",
    )
    sp.add_argument("--dimension", type=int, default=1, help="numbers in one value")
    sp.add_argument(
        "--steps",
        "--ladder",
        type=floats,
        required=True,
        help="levels sold as steps, e.g. 0.25,0.5,1,2 (the cap is sold too; nothing between)",
    )
    sp.add_argument("--cap", type=float, default=None, help="default: the top step")
    sp.add_argument("--retain", type=int, default=16, help="newest values a purchase covers")
    sp.add_argument(
        "--sealed", action="store_true", help="releases of this stream are sealed to each buyer"
    )
    _product_flags(sp)
    sp.add_argument(
        "--price-per-level",
        default="1.00",
        help="price of each unit of level, e.g. 1.00 (EUR): level 2 costs 2.00",
    )
    sp.add_argument(
        "--price-per-precision",
        default=None,
        help="price of each unit of precision (1/variance) instead",
    )
    sp.add_argument("--price-table", default=None, help="e.g. 1=1.00,2=1.50: only these levels")
    sp.add_argument("--currency", default="EUR", help="the prices' currency (ISO 4217)")
    sp.add_argument("--description", default="", help="what the values are, for buyers")
    sp.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the market's answer"
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_register)
    _publish_parser(sub)


def _product_flags(sp: Any) -> None:
    """What a stream sells and whose privacy its levels protect."""
    sp.add_argument(
        "--privacy-window",
        type=duration_ms,
        default=None,
        metavar="DURATION",
        help="the same people are in every value: cap the sum of levels released per window "
        "of this duration (e.g. 1h, 1d; windows start at multiples of it, UTC)",
    )
    sp.add_argument(
        "--running-totals",
        type=int,
        default=None,
        metavar="HEIGHT",
        help="sell the running sums of the values (increments) instead of the values, for up to "
        "2**HEIGHT increments (gaussian only; error grows like log² of the count)",
    )
    sp.add_argument(
        "--histogram",
        default=None,
        metavar="strings|integers:N",
        help="sell sparse histograms (gaussian only): keys are text, released as their public "
        "62-bit hash, or whole numbers below N; --dimension is the most keys of one value",
    )
    sp.add_argument(
        "--rappor",
        type=int,
        default=None,
        metavar="ONES",
        help="sell members' bit reports (laplace only; --dimension bits each, at most ONES set: "
        "a Bloom filter's hashes, 1 for a category) as randomized responses [y + noise > 1/2] "
        "that buyers relax level by level",
    )
    sp.add_argument(
        "--false-keys",
        type=float,
        default=1.0,
        help="with --histogram: keys with a zero count all of one value's releases may show, "
        "on average (sets the thresholds)",
    )
    sp.add_argument(
        "--window-cap",
        type=float,
        default=None,
        help="with --privacy-window: most one window's values may spend together",
    )
    sp.add_argument(
        "--buyer-share",
        type=float,
        default=None,
        metavar="FRACTION",
        help="the most of --cap, and of each window's --window-cap, that one buyer may use "
        "(e.g. 0.25: a quarter; above 0, at most 1); default: no per-buyer limit",
    )


def _publish_parser(sub: Any) -> None:
    sp = sub.add_parser("publish", help="seller: publish values and wait until they are accepted")
    sp.add_argument("--key-file", default=None, help="the seller's keys")
    sp.add_argument("--stream", required=True, help="the stream to publish to")
    sp.add_argument(
        "--value-id", default=None, help="the value's id with --values or --counts (default: new)"
    )
    sp.add_argument("--values", type=floats, default=None, help="e.g. 20.5,21.0")
    sp.add_argument("--file", default=None, help="JSON lines file (or - for stdin)")
    sp.add_argument(
        "--counts",
        default=None,
        metavar="FILE",
        help="one histogram: CSV rows key,count or a JSON object",
    )
    sp.add_argument(
        "--published-at",
        type=int,
        default=None,
        help="publication time (Unix ms); give the original one when resending a value id",
    )
    sp.add_argument("--no-wait", action="store_true", help="send without waiting for the answer")
    _batch_flags(sp)
    sp.add_argument(
        "--skip",
        type=int,
        default=0,
        metavar="N",
        help="with --file: skip its first N values (the ones a publish stopped by Ctrl-C had "
        "sent; it prints this option); default 0",
    )
    sp.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for the market's answer"
    )
    add_json_flag(sp)
    sp.add_argument(
        "--market-sealing-key",
        default=None,
        help="the market's X25519 key the numbers are sealed to (default: market_sealing_key "
        "in the stream's catalog entry, which trusts whoever may write the catalog topic)",
    )
    sp.set_defaults(fn=cmd_publish)


def _batch_size(text: str) -> int:
    from ...wire.events import MAX_BATCH  # noqa: PLC0415

    if not text.isdigit() or not 1 <= int(text) <= MAX_BATCH:
        raise argparse.ArgumentTypeError(
            f"--batch-size takes 1 to {MAX_BATCH} values, got {text!r}"
        )
    return int(text)


def _batch_delay(text: str) -> float:
    try:
        delay = float(text)
    except ValueError:
        delay = -1.0
    if not (math.isfinite(delay) and delay >= 0):
        raise argparse.ArgumentTypeError(f"--batch-delay takes seconds, 0 or more, got {text!r}")
    return delay


def _batch_flags(sp: Any) -> None:
    """How ``publish`` gathers values into batches (:mod:`streams.clients.batching`)."""
    from ..batch_defaults import DEFAULT_MAX_DELAY, DEFAULT_MAX_VALUES  # noqa: PLC0415

    sp.add_argument(
        "--batch-size",
        type=_batch_size,
        default=DEFAULT_MAX_VALUES,
        metavar="N",
        help=f"values per signed batch, at most (default {DEFAULT_MAX_VALUES}: where the "
        "market's CPU per value stops falling; fewer if the broker's message size needs it)",
    )
    sp.add_argument(
        "--batch-delay",
        type=_batch_delay,
        default=DEFAULT_MAX_DELAY,
        metavar="SECONDS",
        help=f"longest a value waits for others to fill its batch (default {DEFAULT_MAX_DELAY})",
    )
