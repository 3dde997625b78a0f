"""``keygen`` and ``account``: a party's keys, and the account that pins them in the market."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from .common import EXIT_REFUSED, CommandError, load_party, refused, run_client
from .output import add_json_flag, show, warn

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
    lines = [
        f"wrote {args.out} (mode 0600) for account {party.account_id!r}: keep it private",
        f"signing key {party.public_key}",
    ]
    if party.sealing_public_key:
        lines.append(f"sealing key {party.sealing_public_key} (releases to you are sealed for it)")
    lines.append(f"next: epsilon-market account open --key-file {args.out}")
    show(
        args,
        {
            "account_id": party.account_id,
            "key_file": args.out,
            "signing_key": party.public_key,
            "sealing_key": party.sealing_public_key,
        },
        "\n".join(lines),
    )
    return 0


def cmd_account_open(args: argparse.Namespace) -> int:
    from ...wire.events import Rejection  # noqa: PLC0415

    party = load_party(args)
    invitation = _invitation(args.invitation)
    where: list[str] = []  # the inbox, as the market's identity lays it out

    async def body(c: Any) -> Any:
        try:
            got = await c.open_account(timeout=args.timeout, invitation=invitation)
        except ValueError as exc:  # a confirmation that pins someone else's keys
            raise CommandError(f"account not opened: {exc}", EXIT_REFUSED) from None
        where.append(c.inbox_of(party))
        return got

    out = run_client(args, body, party)
    if isinstance(out, Rejection):
        raise refused(args, "account opening", out)
    show(
        args,
        out,
        f"account {out.account_id!r} is open (key {out.key_id}, version "
        f"{out.version}); its inbox is {where[0]}",
    )
    return 0


def _invitation(path: str | None) -> Any:
    """The invitation in the file ``path`` (``epsilon-market invite``'s output), or None."""
    if path is None:
        return None
    from pydantic import ValidationError  # noqa: PLC0415

    from ...wire.events import Invitation  # noqa: PLC0415

    try:
        return Invitation.model_validate_json(Path(path).read_bytes())
    except OSError as exc:
        raise CommandError(f"cannot read the invitation {path}: {exc.strerror}") from None
    except ValidationError as exc:
        raise CommandError(
            f"{path} is not an invitation (epsilon-market invite writes one): "
            f"{exc.errors()[0]['msg']}"
        ) from None


def cmd_account_rotate(args: argparse.Namespace) -> int:
    """Replace the account's keys by those of --new-key-file (signed by both)."""
    from ...wire.events import Rejection  # noqa: PLC0415
    from ..keys import KeyFileError, Party  # noqa: PLC0415

    old = load_party(args)
    try:
        new = Party.load(args.new_key_file, on_warning=warn)
    except KeyFileError as exc:
        raise CommandError(f"--new-key-file: {exc}") from None
    if new.account_id != old.account_id:
        raise CommandError(
            f"--new-key-file {args.new_key_file} is for account {new.account_id!r}, not "
            f"{old.account_id!r}: make it with `epsilon-market keygen --account "
            f"{old.account_id} --out {args.new_key_file}`"
        )

    async def body(c: Any) -> Any:
        return await c.rotate_keys(new, args.version, timeout=args.timeout)

    out = run_client(args, body, old)
    if isinstance(out, Rejection):
        hint = (
            " (--version is the account's current version + 1: its inbox's last `account` says it)"
            if out.reason == "stale_key_version"
            else ""
        )
        raise refused(args, "key rotation", out, hint)
    if out.signing_key != new.public_key:
        raise CommandError(
            f"the market's answer pins other keys than {args.new_key_file}'s (key id {out.key_id})",
            EXIT_REFUSED,
        )
    # events are signed at the key version: the new key file records it, and keeps the old
    # sealing keys (what was sealed to them opens with the new file alone, docs/protocol.md §5.2)
    kept = old.retiring(out.version - 1)
    dataclasses.replace(new, key_version=out.version, previous=kept).save_over(args.new_key_file)
    held = (
        f"; it also holds the retired sealing keys ({len(kept)}), so `tail --key-file "
        f"{args.new_key_file}` opens everything sealed before"
        if kept
        else ""
    )
    show(
        args,
        out,
        f"keys of {out.account_id!r} rotated to version {out.version}: use "
        f"{args.new_key_file}{held}",
    )
    return 0


def add_commands(sub: Any) -> None:
    sp = sub.add_parser("keygen", help="a new key file for an account (signing + sealing keys)")
    sp.add_argument("--account", required=True, help="the account id to act as")
    sp.add_argument(
        "--out", required=True, metavar="FILE", help="the key file to create (never overwritten)"
    )
    sp.add_argument(
        "--no-sealing", action="store_true", help="no sealing key (sellers that never buy)"
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_keygen)
    acct = sub.add_parser("account", help="open an account or rotate its keys")
    asub = acct.add_subparsers(dest="account_command", required=True)
    sp = asub.add_parser("open", help="pin the key file's keys to its account id")
    sp.add_argument("--key-file", default=None)
    sp.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the market's answer"
    )
    sp.add_argument(
        "--invitation",
        default=None,
        metavar="FILE",
        help="the operators' invitation (markets that open accounts by invitation)",
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_account_open, command="account open")
    sp = asub.add_parser("rotate", help="replace the account's keys (signed with the old ones)")
    sp.add_argument("--key-file", default=None, help="the current keys")
    sp.add_argument("--new-key-file", required=True, help="keygen output with the same account")
    sp.add_argument("--version", type=int, required=True, help="the account's version + 1")
    sp.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the market's answer"
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_account_rotate, command="account rotate")
