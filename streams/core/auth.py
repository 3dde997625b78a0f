"""Authentication: an event acts for an account only if that account's current key signed it.

Every event a party sends names the account it acts for (``seller_id`` or ``buyer_id``), the key
that signed it (``key_id``) and a signature over its canonical bytes (:mod:`streams.wire.signing`).
:func:`authenticate` checks the three agree. When they do not, the refusal names who really sent
the event when that can be proved — the account owning ``key_id``, if its key verifies the
signature — so the rejection reaches the sender's inbox and nobody else's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from market import MarketError

from ..wire.events import AccountState
from ..wire.signing import key_id_of, signed_v1, verify
from ..wire.times import utc_text
from .context import Context
from .outputs import Defer, Misplaced, Reject

__all__ = ["acting_for", "authenticate", "old_signature_format"]

log = logging.getLogger("emarket.core")


def authenticate(ctx: Context, event: Any, account_id: str, *, final: bool) -> AccountState:
    """The account ``event`` acts for, if its current key signed it; else raise.

    Raises
    ------
    Defer
        The account is unknown and the directory may not have caught up (``final`` False).
    Reject
        ``unknown_account`` or ``bad_signature``, with the proven sender if there is one.
    """
    acct = ctx.directory.get(account_id)
    if acct is None:
        if not final:
            raise Defer(account_id)
        raise Reject(
            "unknown_account",
            f"account {account_id!r} does not exist; open it first (epsilon-market account "
            "open), then send the event again",
            sender=_proven_sender(ctx, event),
            claimed=account_id,
        )
    market = ctx.market
    if event.key_id == acct.key_id and verify(
        market, event, acct.signing_key, generation=acct.version
    ):
        return acct
    _refuse_if_rotated(ctx, event, acct)
    if event.key_id == acct.key_id and signed_v1(
        ctx.market, event, acct.signing_key, generation=acct.version
    ):
        raise old_signature_format(account_id, sender=account_id)
    sender = _proven_sender(ctx, event)
    if event.key_id != acct.key_id:
        signer = f"account {sender!r}" if sender else "a key the market does not know"
        why = f"is signed with key {event.key_id} of {signer}, not {account_id!r}'s ({acct.key_id})"
    else:
        why = f"has a signature that does not match its fields under {account_id!r}'s key"
    raise Reject(
        "bad_signature",
        f"the event claims to act for {account_id!r} but {why}; it was not applied",
        sender=sender,
        claimed=account_id,
    )


def old_signature_format(account_id: str, **who: str) -> Reject:
    """The refusal of an event whose signature verifies only over the first version's bytes
    (``emarket-sig-v1``), which name no market key: never applied, in any market."""
    return Reject(
        "old_signature_format",
        f"the event for {account_id!r} is signed with protocol v1 (emarket-sig-v1), which names "
        "no market key; it was not applied and never will be. Update the client and sign it "
        "again: signatures now name the market's key id (docs/protocol.md §2)",
        **who,
    )


def _refuse_if_rotated(ctx: Context, event: Any, acct: AccountState) -> None:
    """Refuse ``event`` as ``key_rotated``, to its account, if one of the account's past keys
    signed it at the version that key had (a request in flight during a rotation, or bytes
    signed before one): the sender learns why and that signing again is all it takes."""
    for past in reversed(acct.retired):
        if key_id_of(past.signing_key) != event.key_id:
            continue
        if verify(ctx.market, event, past.signing_key, generation=past.version):
            raise Reject(
                "key_rotated",
                f"the event was signed with key {event.key_id} at key version {past.version} "
                f"of {acct.account_id!r}, but the account's keys were rotated: it is at version "
                f"{acct.version} (key {acct.key_id}) since {utc_text(acct.updated_at_ms)}. It "
                "was not applied and never will be; sign it again with the current key and "
                "version and send it again (a purchase may keep its purchase_id)",
                sender=acct.account_id,
                signed_version=past.version,
                current_version=acct.version,
                current_key_id=acct.key_id,
                rotated_at_ms=acct.updated_at_ms,
            )


def _proven_sender(ctx: Context, event: Any) -> str | None:
    """The account whose current key signed ``event``, if the signature verifies under it."""
    owner = ctx.directory.owner_of_key(event.key_id)
    if owner is None:
        return None
    acct = ctx.directory.get(owner)
    if acct is None or acct.key_id != event.key_id:
        return None
    verified = verify(ctx.market, event, acct.signing_key, generation=acct.version)
    return owner if verified else None


@contextlib.contextmanager
def acting_for(account_id: str, stream_id: str | None = None) -> Iterator[None]:
    """Inside the block the event is proven to come from ``account_id`` (about ``stream_id``):
    every refusal from here on — a rule, an engine error, even a bug — is shown to that
    account, naming the stream."""
    try:
        yield
    except Reject as rej:
        if rej.sender is None:
            rej.sender = account_id
        rej.stream = rej.stream or stream_id
        raise
    except MarketError as exc:
        raise Reject(exc.code, exc.message, sender=account_id, stream=stream_id) from None
    except Misplaced:  # not a refusal: the event is forwarded to its own partition
        raise
    except Exception as exc:  # a bug must not stop the market: reject, log, carry on
        log.exception("internal error while processing an event of %s", account_id)
        raise Reject(
            "internal_error",
            "the market could not process this event; the operators have been alerted "
            f"({type(exc).__name__})",
            sender=account_id,
            stream=stream_id,
        ) from None
