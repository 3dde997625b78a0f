"""``invite``: the operators' leave for one party to open an account (docs/protocol.md §6.1.1).

A market run with ``EMARKET_OPENINGS=invite`` (the deployment's default) opens an account only
with an invitation signed by its own key; this command signs one with the key in the worker's
data directory (or ``EMARKET_SIGNING_KEY``), for the market named by ``--prefix``.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path
from typing import Any

from .common import CommandError
from .output import add_json_flag, show

__all__ = ["add_commands"]

_UNITS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(text: str) -> int:
    """``7d``, ``12h``, ``30m``, ``90s``: a positive duration, in milliseconds."""
    m = re.fullmatch(r"([1-9][0-9]{0,6})([smhd])", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 7d, 12h, 30m or 90s")
    return int(m.group(1)) * _UNITS[m.group(2)]


def cmd_invite(args: argparse.Namespace) -> int:
    from ...wire.events import Invitation  # noqa: PLC0415
    from ...wire.ids import ID_PATTERN  # noqa: PLC0415
    from ...wire.invitations import invite  # noqa: PLC0415
    from ...worker.secrets import SIGNING_FILE, load_or_create_keys  # noqa: PLC0415

    if not re.fullmatch(ID_PATTERN, args.account):
        raise CommandError(
            f"{args.account!r} is not an account id (letters, digits, _ and -, 1 to 64)"
        )
    data_dir = Path(args.data_dir or os.environ.get("EMARKET_DATA_DIR") or "data")
    if not os.environ.get("EMARKET_SIGNING_KEY") and not (data_dir / SIGNING_FILE).exists():
        raise CommandError(
            f"no market key in {data_dir} (nor EMARKET_SIGNING_KEY): run this "
            "where the worker's data directory is, or pass --data-dir"
        )
    if args.out and Path(args.out).exists():
        raise CommandError(f"{args.out} exists; invite never overwrites a file")
    try:
        keys = load_or_create_keys(data_dir)
        expires = time.time_ns() // 1_000_000 + args.expires_in
        inv: Invitation = invite(
            keys.signing_key, args.prefix, args.account, expires, args.signing_key
        )
    except ValueError as exc:
        raise CommandError(f"no invitation made: {exc}") from None
    text = inv.model_dump_json(exclude_none=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    where = f"wrote {args.out}" if args.out else text
    show(
        args,
        inv,
        f"{where}\ninvitation for account {args.account!r} in market "
        f"{args.prefix!r} (key {inv.market_key_id}), valid until {expires} ms"
        + ("" if args.signing_key else " for any key: give it to the party only")
        + "\nthe party runs: epsilon-market account open --invitation FILE",
    )
    return 0


def add_commands(sub: Any) -> None:
    sp = sub.add_parser("invite", help="operators: an invitation to open one account")
    sp.add_argument("--account", required=True, help="the account id the invitation opens")
    sp.add_argument(
        "--signing-key",
        default=None,
        help="the party's signing key (base64, keygen prints it): only that key may "
        "open the account (default: any key)",
    )
    sp.add_argument(
        "--expires-in",
        type=_duration_ms,
        default=_duration_ms("7d"),
        help="how long the invitation is valid (default 7d)",
    )
    sp.add_argument(
        "--data-dir",
        default=None,
        help="the worker's data directory, which holds the market key (default "
        "$EMARKET_DATA_DIR or data)",
    )
    sp.add_argument("--out", default=None, metavar="FILE", help="write the invitation to this file")
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_invite)
