"""Invitations: the operators' leave to open one account, signed with the market's key.

A market whose openings are by invitation (``EMARKET_OPENINGS=invite``) opens an account only
for an ``open_account`` carrying an invitation for its id, signed with the market's own Ed25519
key (the one its receipts and answers are signed with; no other key to keep), unexpired and
naming that key's id. The signed bytes (docs/protocol.md §6.1.1) are items of §2's encoding::

    "emarket-invite-v1" ‖ 00 ‖ s(market prefix) ‖ s(market_key_id) ‖ s(account_id) ‖
    [s(signing_key) | n] ‖ i(expires_at_ms)

The market's key id and prefix are in the bytes, so an invitation of one market opens nothing in
another; the account id is, so it opens one account; the signing key may be, so that only the
invited party can use it (an invitation that names no key can be used by whoever sends it first
with the id: give it to the party only).
"""

from __future__ import annotations

import base64
import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from market.receipts import key_id

from .events import Invitation

__all__ = ["DOMAIN", "InvitationError", "check_invitation", "invitation_bytes", "invite"]

DOMAIN = b"emarket-invite-v1\x00"


class InvitationError(ValueError):
    """An invitation that does not open this account: ``reason`` is the refusal's code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _s(text: str | None) -> bytes:
    if text is None:
        return b"n"
    data = text.encode("utf-8")
    return b"s" + struct.pack(">I", len(data)) + data


def invitation_bytes(
    market: str, market_key_id: str, account_id: str, signing_key: str | None, expires_at_ms: int
) -> bytes:
    """What the market's key signs for an invitation (docs/protocol.md §6.1.1)."""
    return (
        DOMAIN
        + _s(market)
        + _s(market_key_id)
        + _s(account_id)
        + _s(signing_key)
        + b"i"
        + struct.pack(">q", expires_at_ms)
    )


def invite(
    key: Ed25519PrivateKey,
    market: str,
    account_id: str,
    expires_at_ms: int,
    signing_key: str | None = None,
) -> Invitation:
    """An invitation for ``account_id`` (and only ``signing_key``, if given), signed with the
    market's key ``key``."""
    kid = key_id(key.public_key())
    sig = key.sign(invitation_bytes(market, kid, account_id, signing_key, expires_at_ms))
    return Invitation(
        account_id=account_id,
        signing_key=signing_key,
        expires_at_ms=expires_at_ms,
        market_key_id=kid,
        signature=base64.b64encode(sig).decode(),
    )


def check_invitation(
    inv: Invitation | None,
    market: str,
    public: Ed25519PublicKey,
    account_id: str,
    signing_key: str,
    now_ms: int,
) -> None:
    """Raise :class:`InvitationError` unless ``inv`` lets ``account_id`` open with
    ``signing_key`` in the market ``market`` whose key is ``public``, at ``now_ms``."""
    if inv is None:
        raise InvitationError(
            "invitation_required",
            "this market opens accounts by invitation only: ask its operators for an "
            "invitation for your account id and key (`epsilon-market invite`) and open the "
            "account with it (`epsilon-market account open --invitation FILE`)",
        )
    kid = key_id(public)
    if inv.market_key_id != kid:
        raise InvitationError(
            "bad_invitation",
            f"the invitation names market key {inv.market_key_id}, not this market's ({kid}): "
            "it was issued by another market",
        )
    if inv.account_id != account_id or inv.signing_key not in (None, signing_key):
        raise InvitationError(
            "bad_invitation",
            f"the invitation is for account {inv.account_id!r}"
            + ("" if inv.signing_key is None else " and another signing key")
            + f", not for {account_id!r} with this key: ask the operators for one of your own",
        )
    try:
        public.verify(
            base64.b64decode(inv.signature),
            invitation_bytes(market, kid, inv.account_id, inv.signing_key, inv.expires_at_ms),
        )
    except InvalidSignature:
        raise InvitationError(
            "bad_invitation",
            "the invitation's signature is not the market's: it was altered "
            "or forged; ask the operators for a new one",
        ) from None
    if inv.expires_at_ms < now_ms:
        raise InvitationError(
            "invitation_expired",
            f"the invitation expired at {inv.expires_at_ms} ms (the market's clock: {now_ms} ms):"
            " ask the operators for a new one",
        )
