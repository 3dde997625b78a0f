"""Proof of work for an opening in an open market: what one account costs its sender.

An open market (``EMARKET_OPENINGS=open``) opens an account for anyone, and nothing tells one
sender's openings from another's: every opening names a new id and a new key. So the market
makes each opening cost its sender some work the market checks in one hash (docs/protocol.md
§6.1.2): ``work``, a text the sender chooses, such that::

    SHA-256("emarket-work-v1" ‖ 00 ‖ s(market prefix) ‖ s(account_id) ‖ s(signing_key) ‖ s(work))

begins with at least ``bits`` zero bits, ``bits`` being the market's setting
(``EMARKET_OPENING_WORK``, :data:`DEFAULT_BITS` by default). The account id and key are in the
hash, so work done for one opening opens nothing else. With 2^bits hashes an opening, one
sender opens at most its hash rate / 2^bits accounts a second, whatever ids it picks, and that
rate is below a partition's share of the openings allowance for a sender with the computing
power of an honest one (docs/operations.md, "Openings").
"""

from __future__ import annotations

import hashlib
import struct

__all__ = ["DEFAULT_BITS", "DOMAIN", "MAX_BITS", "leading_zero_bits", "solve", "work_bits"]

DOMAIN = b"emarket-work-v1\x00"
DEFAULT_BITS = 20
"""An open market's work per opening: ~10^6 hashes, about a second of one core in Python."""
MAX_BITS = 32
"""The most work a market may ask (and a client does)."""


def _s(text: str) -> bytes:
    data = text.encode("utf-8")
    return b"s" + struct.pack(">I", len(data)) + data


def _head(market: str, account_id: str, signing_key: str) -> bytes:
    return DOMAIN + _s(market) + _s(account_id) + _s(signing_key)


def leading_zero_bits(digest: bytes) -> int:
    """How many zero bits ``digest`` begins with."""
    value = int.from_bytes(digest, "big")
    return len(digest) * 8 - value.bit_length()


def work_bits(market: str, account_id: str, signing_key: str, work: str) -> int:
    """The work ``work`` proves for this opening: the leading zero bits of its hash."""
    return leading_zero_bits(
        hashlib.sha256(_head(market, account_id, signing_key) + _s(work)).digest()
    )


def solve(market: str, account_id: str, signing_key: str, bits: int) -> str:
    """A ``work`` text proving ``bits`` bits for this opening (2^bits hashes on average)."""
    if not 0 <= bits <= MAX_BITS:
        raise ValueError(f"work is 0 to {MAX_BITS} bits, not {bits}")
    base = hashlib.sha256(_head(market, account_id, signing_key))
    bound = 1 << (256 - bits)
    n = 0
    while True:
        text = str(n).encode()
        h = base.copy()
        h.update(b"s" + struct.pack(">I", len(text)) + text)
        if int.from_bytes(h.digest(), "big") < bound:
            return text.decode()
        n += 1
