"""Openings by invitation (issue #40): a market run with ``openings="invite"`` opens an account
only with an invitation signed with its own key, for that id (and key), unexpired."""

from __future__ import annotations

import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from streams.core import MarketCore, Stores
from streams.core.context import Limits
from streams.wire.events import Invitation
from streams.wire.invitations import check_invitation, invitation_bytes, invite
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, party, protocol_vectors, signed_for

T = Topics("t")
NOW = 1_000_000


def _core() -> MarketCore:
    return MarketCore(Stores(), TEST_KEYS, T, clock=lambda: NOW, limits=Limits(openings="invite"))


def _opening(name: str, invitation: Any = None) -> bytes:
    ev = party(name).open_account(signed_for(T.prefix), opened_at_ms=NOW, invitation=invitation)
    return ev.model_dump_json().encode()


def _refusal(out: Any) -> str:
    assert out.status == "rejected", out.status
    assert all(not T.is_inbox(o.topic) for o in out.outputs)  # nobody is proven by it
    return str(json.loads(out.outputs[0].value)["reason"])


def test_an_opening_without_an_invitation_is_refused_saying_how_to_get_one() -> None:
    out = _core().handle(T.accounts, _opening("alice"))
    assert _refusal(out) == "invitation_required"
    assert "epsilon-market invite" in json.loads(out.outputs[0].value)["message"]


def test_forged_foreign_misdirected_and_expired_invitations_are_refused() -> None:
    c = _core()
    alice = party("alice")
    good = invite(TEST_KEYS.signing_key, T.prefix, "alice", NOW + 60_000, alice.public_key)
    forged = invite(Ed25519PrivateKey.generate(), T.prefix, "alice", NOW + 60_000)
    foreign = forged.model_copy(update={"market_key_id": good.market_key_id})
    other_market = invite(TEST_KEYS.signing_key, "u", "alice", NOW + 60_000)
    stretched = good.model_copy(update={"expires_at_ms": NOW + 10**9})
    cases = {
        "bad_invitation": [
            forged,
            foreign,
            other_market,
            stretched,
            invite(TEST_KEYS.signing_key, T.prefix, "bob", NOW + 60_000),
            invite(
                TEST_KEYS.signing_key, T.prefix, "alice", NOW + 60_000, party("mallory").public_key
            ),
        ],
        "invitation_expired": [invite(TEST_KEYS.signing_key, T.prefix, "alice", NOW - 1)],
    }
    for reason, invitations in cases.items():
        for inv in invitations:
            assert _refusal(c.handle(T.accounts, _opening("alice", inv))) == reason, inv
    assert "alice" not in c.stores.accounts


def test_a_valid_invitation_opens_the_account_once() -> None:
    c = _core()
    alice = party("alice")
    inv = invite(TEST_KEYS.signing_key, T.prefix, "alice", NOW + 60_000, alice.public_key)
    assert c.handle(T.accounts, _opening("alice", inv)).status == "accepted"
    assert c.handle(T.accounts, _opening("alice", inv)).status == "duplicate"
    anyone = invite(TEST_KEYS.signing_key, T.prefix, "bob", NOW)  # any key; expires now
    assert c.handle(T.accounts, _opening("bob", anyone)).status == "accepted"


def test_an_open_market_needs_no_invitation() -> None:
    c = MarketCore(Stores(), TEST_KEYS, T, clock=lambda: NOW)
    assert c.handle(T.accounts, _opening("alice")).status == "accepted"


def test_the_invitation_bytes_are_the_protocols() -> None:
    """docs/protocol.md §6.1.1: the domain, then §2's items."""
    got = invitation_bytes("t", "56475aa75463474c", "alice", None, 1000)
    assert got == (
        b"emarket-invite-v1\x00"
        + b"s\x00\x00\x00\x01t"
        + b"s\x00\x00\x00\x1056475aa75463474c"
        + b"s\x00\x00\x00\x05alice"
        + b"n"
        + b"i"
        + (1000).to_bytes(8, "big")
    )


def test_the_protocols_invitation_vectors() -> None:
    book = protocol_vectors("invitation")
    public = TEST_KEYS.signing_key.public_key()
    for v in book["vectors"]:
        inv = Invitation.model_validate(v["invitation"])
        signed = invitation_bytes(
            book["market_prefix"],
            inv.market_key_id,
            inv.account_id,
            inv.signing_key,
            inv.expires_at_ms,
        )
        assert signed.hex() == v["bytes"]
        made = invite(
            TEST_KEYS.signing_key,
            book["market_prefix"],
            inv.account_id,
            inv.expires_at_ms,
            inv.signing_key,
        )
        assert made == inv  # Ed25519 signatures are deterministic
        check_invitation(inv, "t", public, "alice", party("alice").public_key, 0)
