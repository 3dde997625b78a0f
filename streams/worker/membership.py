"""Workers prove to each other that they are workers of this market: a tag in their group metadata.

On a broker that lets anyone join any consumer group (the embedded one does; Kafka without the
group ACLs of ``deploy/kafka/setup-security.sh`` too), a stranger that joins the workers' group
under Faust's assignor name is given input partitions like any worker, and the events on them
are never processed while it holds them (issue #39). So every worker puts in its JoinGroup
metadata a proof, :class:`MemberProof`: an HMAC under a key derived from the noise secret
(:func:`streams.worker.secrets.membership_key`) over the group id, a random nonce drawn once per
worker incarnation, the time the proof was made and the member id the broker gave the worker,
when it knows it. A worker that leads the group judges every member's proof
(:meth:`Membership.judge`) and assigns nothing to a member whose proof does not hold
(``streams.worker.faust_internals``, ``proving_assignor``). The bytes are ``docs/protocol.md``
§13; this module is their one implementation.

**What was measured, and why a proof is not always bound to its member id.** aiokafka 0.14
computes a member's metadata once per join, *before* it sends JoinGroup
(``CoordinatorGroupRebalance.perform_group_join``); on a first join the member id is still
empty, and the KIP-394 retry after ``MEMBER_ID_REQUIRED`` (Kafka 2.2 and later) resends the
same bytes with the new id. Tansu 0.6 answers a first JoinGroup (v5) with the member id at once.
On both brokers, then, a worker's first proof names no member id ("unbound"); every later join
of the same incarnation binds it. An unbound proof could be copied by whoever sees the group's
metadata, so the judge accepts a proof only if it is *fresh* (made within ``window_ms`` of the
leader's clock: a genuine worker makes a new one at every join), and refuses every member whose
nonce another member also presents, unless exactly one of them binds its own id (the copies
then lose), and any member that presents the leader's own nonce or holds the leader's member id
with another nonce. What remains (docs/operations.md, "Group membership"): a stranger that saw a
worker's metadata can present its proof in the window after that worker left the group.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DOMAIN",
    "PROOF_FIELD",
    "REFUSALS",
    "SKEW_MS",
    "MemberProof",
    "Membership",
    "covered",
    "lp16",
    "proof_in",
    "with_proof",
]

log = logging.getLogger("emarket.membership")

DOMAIN = b"emarket-member-v1"
"""First bytes of what a member proof's tag covers (no other tag of the market covers them)."""

VERSION = 1
NONCE_BYTES = 16

PROOF_FIELD = "emarket_member"
"""The key of the proof in the JSON object of a worker's JoinGroup user data (Faust's
``ClientMetadata``, which keeps keys it does not know: a Faust worker of another version still
reads the rest)."""

SKEW_MS = 30_000
"""How far apart the workers' clocks may be, on top of the longest join (see ``window_ms``)."""

REFUSALS = ("no_proof", "bad_proof", "stale", "other_member", "duplicate", "impersonated")
"""Why a leader refused a member (the ``reason`` label of ``emarket_group_members_refused_total``):
no proof in its metadata; a tag that does not verify (or another group's); a proof made too long
ago (or ahead of the leader's clock); a proof bound to another member id; a nonce another member
presents too; the leader's own member id or nonce, presented by someone else."""


def lp16(text: str) -> bytes:
    """``u16be(len) ‖ UTF-8 bytes`` of ``text``: how proofs and seals write an id."""
    data = text.encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError("a group or member id is at most 65,535 bytes")
    return len(data).to_bytes(2, "big") + data


def covered(group: str, nonce: bytes, issued_ms: int, member_id: str) -> bytes:
    """What a proof's tag covers (``docs/protocol.md`` §13.2)::

        "emarket-member-v1" ‖ u16be(len G) ‖ G ‖ nonce (16 bytes) ‖ u64be(issued_ms)
                            ‖ u16be(len M) ‖ M

    G the group id and M the member id (empty when the proof is unbound), UTF-8. Every field
    has a fixed length or a length prefix: no two proofs share covered bytes.
    """
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce is {NONCE_BYTES} bytes")
    return DOMAIN + lp16(group) + nonce + issued_ms.to_bytes(8, "big") + lp16(member_id)


@dataclass(frozen=True)
class MemberProof:
    """One proof, as it travels: JSON under :data:`PROOF_FIELD`."""

    nonce: bytes
    issued_ms: int
    member_id: str
    tag: bytes = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "nonce": self.nonce.hex(),
            "issued_ms": self.issued_ms,
            "member_id": self.member_id,
            "tag": self.tag.hex(),
        }

    @classmethod
    def from_json(cls, obj: Any) -> MemberProof | None:
        """The proof in ``obj``, or None if it is not one of the right shape."""
        try:
            proof = cls(
                bytes.fromhex(obj["nonce"]),
                obj["issued_ms"],
                obj["member_id"],
                bytes.fromhex(obj["tag"]),
            )
            ok = (
                obj["v"] == VERSION
                and isinstance(proof.issued_ms, int)
                and isinstance(proof.member_id, str)
                and len(proof.nonce) == NONCE_BYTES
                and len(proof.tag) == 32
            )
        except (KeyError, TypeError, ValueError):
            return None
        return proof if ok and 0 <= proof.issued_ms < 2**63 else None


def proof_in(user_data: bytes) -> MemberProof | None:
    """The proof in a member's JoinGroup user data (a JSON object), None if it carries none."""
    try:
        obj = json.loads(user_data)
    except (ValueError, UnicodeDecodeError):
        return None
    return MemberProof.from_json(obj.get(PROOF_FIELD)) if isinstance(obj, dict) else None


def with_proof(user_data: bytes, proof: MemberProof) -> bytes:
    """``user_data`` (a JSON object) with ``proof`` added under :data:`PROOF_FIELD`."""
    obj = json.loads(user_data)
    obj[PROOF_FIELD] = proof.to_json()
    return json.dumps(obj, separators=(",", ":")).encode()


@dataclass
class Membership:
    """This worker's proofs and its judgement of others', in one group under one key.

    Parameters
    ----------
    key : bytes
        :func:`~streams.worker.secrets.membership_key` of the noise secret (never printed).
    group : str
        The consumer group (the app id): a proof for another group does not verify here.
    window_ms : int
        How old (or how far ahead) a proof may be when the leader judges it: the longest a join
        may take (Faust's rebalance timeout) plus :data:`SKEW_MS`.
    clock : callable
        Milliseconds since the epoch (tests stop it).
    """

    key: bytes = field(repr=False)
    group: str
    window_ms: int = 90_000
    clock: Callable[[], int] = field(default=lambda: time.time_ns() // 1_000_000, repr=False)
    nonce: bytes = field(default_factory=lambda: secrets.token_bytes(NONCE_BYTES), repr=False)

    def __post_init__(self) -> None:
        if len(self.key) < 16:
            raise ValueError("a membership key is at least 16 bytes")

    def tag(self, nonce: bytes, issued_ms: int, member_id: str) -> bytes:
        return hmac.digest(self.key, covered(self.group, nonce, issued_ms, member_id), "sha256")

    def prove(self, member_id: str) -> MemberProof:
        """A fresh proof of this worker, bound to ``member_id`` ("" while it has none)."""
        now = self.clock()
        return MemberProof(self.nonce, now, member_id, self.tag(self.nonce, now, member_id))

    def check(self, proof: MemberProof | None, member_id: str) -> str | None:
        """Why ``proof``, presented by ``member_id``, is not a worker's (None: it is), freshness
        aside: the tag under this group and key, and the member id it is bound to, if any."""
        if proof is None:
            return "no_proof"
        expected = self.tag(proof.nonce, proof.issued_ms, proof.member_id)
        if not hmac.compare_digest(expected, proof.tag):
            return "bad_proof"
        if proof.member_id and proof.member_id != member_id:
            return "other_member"
        return None

    def judge(self, proofs: Mapping[str, MemberProof | None], leader_id: str) -> dict[str, str]:
        """The members a leader must give nothing, each with its :data:`REFUSALS` reason.

        ``proofs`` maps every member id of the join to the proof its metadata carries; the
        leader (``leader_id``) is judged like the others, so a stranger that took its member id
        with another proof is refused there too.
        """
        now = self.clock()
        refused: dict[str, str] = {}
        valid: dict[str, MemberProof] = {}
        for member, proof in proofs.items():
            why = self.check(proof, member)
            if proof is not None and why is None:
                if abs(now - proof.issued_ms) > self.window_ms:
                    why = "stale"
                elif (member == leader_id) != (proof.nonce == self.nonce):
                    why = "impersonated"
                else:
                    valid[member] = proof
            if why is not None:
                refused[member] = why
        refused.update(_copies(valid))
        return refused

    def standing(self, proofs: Mapping[str, MemberProof | None]) -> dict[str, str]:
        """The members of a group as described after the fact (DescribeGroups) whose proofs do
        not stand, and why: as :meth:`judge` without its freshness rule (a stable group's
        metadata is from its last join, however long ago) and without a leader's own nonce."""
        refused: dict[str, str] = {}
        valid: dict[str, MemberProof] = {}
        for member, proof in proofs.items():
            why = self.check(proof, member)
            if proof is not None and why is None:
                valid[member] = proof
            else:
                refused[member] = why or "no_proof"
        refused.update(_copies(valid))
        return refused


def _copies(valid: Mapping[str, MemberProof]) -> dict[str, str]:
    """Members whose nonce another member presents too: all of them, except the one whose
    proof binds its own member id when exactly one does (the others copied it)."""
    by_nonce: dict[bytes, list[str]] = defaultdict(list)
    for member, proof in valid.items():
        by_nonce[proof.nonce].append(member)
    refused = {}
    for members in by_nonce.values():
        if len(members) > 1:
            bound = [m for m in members if valid[m].member_id == m]
            keep = bound[0] if len(bound) == 1 else None
            refused.update({m: "duplicate" for m in members if m != keep})
    return refused
