"""``keygen`` and ``account``: a party's keys, and the account that pins them in the market."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from .common import EXIT_REFUSED, CommandError, load_party, run_client, warn

__all__ = ["add_commands"]


def cmd_keygen(args: argparse.Namespace) -> int:
    from ..keys import KeyFileError, Party  # noqa: PLC0415

    if Path(args.out).exists():
        raise CommandError(f"{args.out} exists; keygen never overwrites a key file")
    try:
        party = Party.generate(args.account, sealing=not args.no_sealing)
        party.save(args.out)
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"wrote {args.out} (mode 0600) for account {party.account_id!r}: keep it private")
    print(f"signing key {party.public_key}")
    if party.sealing_public_key:
        print(f"sealing key {party.sealing_public_key} (releases to you are sealed for it)")
    print(f"next: epsilon-market account open --key-file {args.out}")
    return 0


def cmd_account_open(args: argparse.Namespace) -> int:
    from ...wire.events import Rejection  # noqa: PLC0415

    party = load_party(args)

    async def body(c: Any) -> Any:
        try:
            return await c.open_account(timeout=args.timeout)
        except ValueError as exc:  # a confirmation that pins someone else's keys
            raise CommandError(f"account not opened: {exc}", EXIT_REFUSED) from None

    out = run_client(args, body, party)
    if isinstance(out, Rejection):
        raise CommandError(f"account not opened ({out.reason}): {out.message}", EXIT_REFUSED)
    print(f"account {out.account_id!r} is open (key {out.key_id}, version {out.version}); "
          f"its inbox is {args.prefix}.inbox.{out.account_id}")  # fmt: skip
    return 0


def cmd_account_rotate(args: argparse.Namespace) -> int:
    """Replace the account's keys by those of --new-key-file (signed by both)."""
    from ...wire.events import AccountState, RotateKeys  # noqa: PLC0415
    from ..keys import KeyFileError, Party  # noqa: PLC0415

    old = load_party(args)
    try:
        new = Party.load(args.new_key_file)
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None

    async def body(c: Any) -> Any:
        event: RotateKeys = old.rotate_to(new, c.market, args.version)
        await c.send(c.topics.accounts, old.account_id, event.model_dump_json().encode())
        async for ev in c.tail(idle_timeout=args.timeout, party=old):
            if isinstance(ev, AccountState) and ev.version == args.version and (
                ev.signing_key == new.public_key
            ):
                return ev
        return None

    out = run_client(args, body, old)
    if out is None:
        raise CommandError(
            "no confirmation of the new keys; check the version (the account's current version "
            "+ 1) and `epsilon-market rejections`", EXIT_REFUSED,
        )  # fmt: skip
    # events are signed at the key version: the new key file records it
    dataclasses.replace(new, key_version=out.version).save_over(args.new_key_file)
    warn(f"keys of {out.account_id!r} rotated to version {out.version}: use {args.new_key_file}")
    return 0


def add_commands(sub: Any) -> None:
    sp = sub.add_parser("keygen", help="a new key file for an account (signing + sealing keys)")
    sp.add_argument("--account", required=True, help="the account id to act as")
    sp.add_argument("--out", required=True, help="the key file to create (never overwritten)")
    sp.add_argument("--no-sealing", action="store_true",
                    help="no sealing key (sellers that never buy)")  # fmt: skip
    sp.set_defaults(fn=cmd_keygen)
    acct = sub.add_parser("account", help="open an account or rotate its keys")
    asub = acct.add_subparsers(dest="account_command", required=True)
    sp = asub.add_parser("open", help="pin the key file's keys to its account id")
    sp.add_argument("--key-file", default=None)
    sp.add_argument("--timeout", type=float, default=30.0)
    sp.set_defaults(fn=cmd_account_open, command="account open")
    sp = asub.add_parser("rotate", help="replace the account's keys (signed with the old ones)")
    sp.add_argument("--key-file", default=None, help="the current keys")
    sp.add_argument("--new-key-file", required=True, help="keygen output with the same account")
    sp.add_argument("--version", type=int, required=True, help="the account's version + 1")
    sp.add_argument("--timeout", type=float, default=10.0)
    sp.set_defaults(fn=cmd_account_rotate, command="account rotate")
