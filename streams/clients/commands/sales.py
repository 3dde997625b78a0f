"""``sales``: what a seller sold, read from the sale notices the market signed in its inbox.

One line per sale (stream, buyer, level bought, price, values, time), then totals per stream
and overall, per currency; ``--json`` gives every field and the totals in minor units;
``--stream`` keeps one stream's; ``--follow`` keeps reading and prints each sale as it comes
(the totals at Ctrl-C; with ``--json``, one JSON line per sale). Buyers are shown by the
pseudonym the market gives them for this seller (docs/protocol.md §8.4): the same for every
sale to one buyer, not its account id.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .common import load_party, print_json, read_inbox
from .output import add_json_flag, json_mode

__all__ = ["add_commands", "totals"]

_ROW = "{:<20} {:<16} {:<22} {:>14} {:>7}  {}"


def totals(sales: list[Any]) -> dict[str, dict[str, dict[str, int]]]:
    """stream → currency → ``{"sales": count, "price_minor": sum}``."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for s in sales:
        t = out.setdefault(s.stream_id, {}).setdefault(s.currency, {"sales": 0, "price_minor": 0})
        t["sales"] += 1
        t["price_minor"] += s.price_minor
    return out


def _row(sale: Any) -> str:
    from ...wire.money import format_money  # noqa: PLC0415

    level = f"{sale.level_before:g} -> {sale.level_after:g} {sale.level_unit}"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(sale.sold_at_ms / 1000))
    return _ROW.format(
        sale.stream_id,
        sale.buyer_ref[:16],
        level,
        format_money(sale.price_minor, sale.currency),
        sale.value_count,
        when,
    )


def _header() -> str:
    return _ROW.format("stream", "buyer", "level bought", "price", "values", "sold at (UTC)")


def _total_lines(sales: list[Any]) -> list[str]:
    """A line per stream and currency, then one per currency over every stream, in the
    table's columns (prices under prices)."""
    from ...wire.money import format_money  # noqa: PLC0415

    overall: dict[str, dict[str, int]] = {}
    lines = []
    for stream, by_currency in sorted(totals(sales).items()):
        for currency, t in sorted(by_currency.items()):
            lines.append(_total(f"total {stream}", t, currency, format_money))
            o = overall.setdefault(currency, {"sales": 0, "price_minor": 0})
            o["sales"] += t["sales"]
            o["price_minor"] += t["price_minor"]
    for currency, t in sorted(overall.items()):
        lines.append(_total("total", t, currency, format_money))
    return lines


def _total(label: str, t: dict[str, int], currency: str, money: Any) -> str:
    count = f"{t['sales']} sale" + ("" if t["sales"] == 1 else "s")
    return _ROW.format(label, count, "", money(t["price_minor"], currency), "", "").rstrip()


def cmd_sales(args: argparse.Namespace) -> int:
    party = load_party(args)
    sales: list[Any] = []

    async def body(c: Any) -> None:
        if args.follow and not json_mode(args):
            print(_header(), flush=True)
        async for sale in c.sales(stream_id=args.stream, idle_timeout=None if args.follow else 2.0):
            sales.append(sale)
            if args.follow:
                print(sale.model_dump_json() if json_mode(args) else _row(sale), flush=True)

    read_inbox(args, body, party)
    if json_mode(args):
        if not args.follow:
            print_json(
                {"sales": [json.loads(s.model_dump_json()) for s in sales], "totals": totals(sales)}
            )
        return 0
    if not sales:
        print("no sales yet" + (f" on stream {args.stream!r}" if args.stream else ""))
        return 0
    if not args.follow:
        print(_header())
        for sale in sales:
            print(_row(sale))
    for line in _total_lines(sales):
        print(line)
    return 0


def add_commands(sub: Any) -> None:
    sp = sub.add_parser(
        "sales",
        help="seller: what your streams sold, to whom (a pseudonym), for how much, with totals",
    )
    sp.add_argument("--key-file", default=None, help="the seller's keys (names its inbox)")
    sp.add_argument("--stream", default=None, help="only this stream's sales")
    add_json_flag(sp)
    sp.add_argument(
        "--follow",
        action="store_true",
        help="keep reading: print each sale as it comes, the totals at Ctrl-C",
    )
    sp.set_defaults(fn=cmd_sales)
