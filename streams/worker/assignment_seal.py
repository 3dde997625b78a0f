"""The leader's seal on an assignment: what every worker checks it was given by one of its own.

A member of a consumer group sees no other member's metadata: only the leader does. A stranger
elected leader (on an open broker, the first member of a fresh group is) can give itself input
partitions and the workers the rest, and nothing in Faust tells them. So a worker that leads
puts a :class:`Seal` into every member's assignment (beside Faust's own data, under
:data:`SEAL_FIELD`): the whole assignment of the generation, member by member, and which members
it refused and why, tagged under the membership key (``docs/protocol.md`` §13.3). Each worker
opens the seal of its own assignment (:func:`open_seal`): if it is missing, does not verify, is
for another generation or does not give it exactly the partitions it received, the leader is
not a proven worker, and the worker says so (:mod:`streams.worker.group_watch`). A stranger
cannot make a seal, and cannot reuse one: it names the generation, which the broker raises at
every rebalance.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .membership import lp16

__all__ = ["DOMAIN", "SEAL_FIELD", "Seal", "covered", "make_seal", "open_seal"]

DOMAIN = b"emarket-seal-v1"
"""First bytes of what a seal's tag covers."""

VERSION = 1

SEAL_FIELD = "emarket_seal"
"""The key of the seal in the JSON object of an assignment's user data (Faust's
``ClientMetadata``, which keeps keys it does not know)."""

Partitions = tuple[tuple[str, int], ...]
"""(topic, partition) pairs, sorted: what one member was given."""


def _partitions(pairs: Iterable[tuple[str, int]]) -> Partitions:
    return tuple(sorted({(str(t), int(p)) for t, p in pairs}))


def covered(
    group: str,
    generation: int,
    leader_id: str,
    members: Mapping[str, Partitions],
    refused: Mapping[str, str],
) -> bytes:
    """What a seal's tag covers (``docs/protocol.md`` §13.3)::

        "emarket-seal-v1" ‖ u16be(len G) ‖ G ‖ u32be(generation) ‖ u16be(len L) ‖ L
          ‖ u32be(n) ‖ n × ( u16be(len M) ‖ M ‖ u16be(len R) ‖ R ‖ u32be(k)
                             ‖ k × ( u16be(len T) ‖ T ‖ u32be(partition) ) )

    one entry per member (given partitions or refused), in the order of their ids' UTF-8 bytes;
    R is the refusal's reason, empty for a member given partitions; a member's (topic,
    partition) pairs sorted by topic bytes, then partition.
    """
    ids = sorted(set(members) | set(refused), key=lambda m: m.encode("utf-8"))
    out = [
        DOMAIN,
        lp16(group),
        generation.to_bytes(4, "big"),
        lp16(leader_id),
        len(ids).to_bytes(4, "big"),
    ]
    for m in ids:
        pairs = sorted(members.get(m, ()), key=lambda tp: (tp[0].encode("utf-8"), tp[1]))
        out += [lp16(m), lp16(refused.get(m, "")), len(pairs).to_bytes(4, "big")]
        out += [lp16(t) + p.to_bytes(4, "big") for t, p in pairs]
    return b"".join(out)


@dataclass(frozen=True)
class Seal:
    """One generation's assignment as its leader made it."""

    generation: int
    leader_id: str
    members: Mapping[str, Partitions]
    refused: Mapping[str, str]
    tag: bytes = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "generation": self.generation,
            "leader": self.leader_id,
            "members": {m: [list(tp) for tp in ps] for m, ps in self.members.items()},
            "refused": dict(self.refused),
            "tag": self.tag.hex(),
        }

    @classmethod
    def from_json(cls, obj: Any) -> Seal | None:
        """The seal in ``obj``, or None if it is not one of the right shape."""
        try:
            members = {
                str(m): _partitions((t, p) for t, p in ps) for m, ps in obj["members"].items()
            }
            refused = {str(m): str(r) for m, r in obj["refused"].items()}
            seal = cls(
                obj["generation"], obj["leader"], members, refused, bytes.fromhex(obj["tag"])
            )
            ok = (
                obj["v"] == VERSION
                and isinstance(seal.generation, int)
                and isinstance(seal.leader_id, str)
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        return seal if ok and 0 <= seal.generation < 2**31 else None


def make_seal(
    key: bytes,
    group: str,
    generation: int,
    leader_id: str,
    members: Mapping[str, Iterable[tuple[str, int]]],
    refused: Mapping[str, str],
) -> Seal:
    """The seal of an assignment: ``members`` → the (topic, partition) pairs each was given."""
    given = {m: _partitions(ps) for m, ps in members.items()}
    tag = hmac.digest(key, covered(group, generation, leader_id, given, refused), "sha256")
    return Seal(generation, leader_id, given, dict(refused), tag)


def open_seal(
    key: bytes,
    group: str,
    obj: Any,
    generation: int,
    member_id: str,
    received: Iterable[tuple[str, int]],
) -> tuple[Seal | None, str | None]:
    """Check the seal ``obj`` of the assignment ``member_id`` received in ``generation``.

    Returns the seal and None if it holds, else None (or the seal, when only its contents are
    wrong) and why: a stranger led the join, or replayed another generation's seal.
    """
    if obj is None:
        return None, "its assignment carries no seal"
    seal = Seal.from_json(obj)
    if seal is None:
        return None, "its assignment carries a malformed seal"
    expected = hmac.digest(
        key, covered(group, seal.generation, seal.leader_id, seal.members, seal.refused), "sha256"
    )
    if not hmac.compare_digest(expected, seal.tag):
        return None, "its assignment's seal does not verify"
    if seal.generation != generation:
        return None, f"its seal is of generation {seal.generation}, not {generation}"
    if member_id in seal.refused:
        return seal, None  # a refused worker's assignment is empty; its view says so
    if seal.members.get(member_id) != _partitions(received):
        return None, "its seal does not name the partitions this worker was given"
    return seal, None
