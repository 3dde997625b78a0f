"""Who holds the input partitions: this worker's view of its consumer group, for /health and alerts.

Two sources, each checked against the market's membership key:

* **The seal of this worker's assignment** (:mod:`streams.worker.assignment_seal`), read at every
  rebalance: the leader's whole assignment, member by member, if the leader is a proven worker.
  Without a valid seal the leader is a stranger, and every input partition this worker was not
  given may be in a stranger's hands.
* **DescribeGroups**, asked every :data:`DESCRIBE_EVERY_S` seconds by :meth:`GroupWatch.poll`.
  Apache Kafka answers every member's metadata and assignment: each member's proof is checked
  (:meth:`~streams.worker.membership.Membership.standing`) and the input partitions held by
  members without one, or by nobody, are found without trusting any member. **Tansu 0.6 answers
  only the member ids** (metadata, assignment, protocol, client id and host all empty: measured
  on v0–v3), so there the seal is the source and the member list only names the members the
  seal does not know.

:func:`assess` turns both into an :class:`Assessment`: the input partitions not held by a proven
worker (``emarket_group_unproven_partitions``), the members without a proof
(``emarket_group_unproven_members``), and what the operator reads. While there are such
partitions, or the leader did not prove itself, or it refused this worker, ``/health`` answers
503 ``untrusted_group``, ``emarket_group_untrusted`` is 1 and ``MarketGroupIntruder`` pages.
The leader's refusals are counted when it makes them
(``emarket_group_members_refused_total{reason}``, :meth:`GroupWatch.judge`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocol

from .assignment_seal import Seal, make_seal, open_seal
from .membership import MemberProof, Membership, proof_in, with_proof
from .metrics import Metrics

__all__ = [
    "DESCRIBE_EVERY_S",
    "Assessment",
    "Described",
    "GroupView",
    "GroupWatch",
    "assess",
    "described_from",
]

log = logging.getLogger("emarket.membership")

DESCRIBE_EVERY_S = 10.0
"""How often a worker describes its group: one FindCoordinator and one DescribeGroups."""

TP = tuple[str, int]
ADVICE = 'see docs/operations.md, "Group membership"'


@dataclass(frozen=True)
class GroupView:
    """What this worker learned of its group at its last assignment."""

    generation: int
    member_id: str
    mine: frozenset[TP]
    seal: Seal | None  # None: the leader did not prove it is a worker
    why_unsealed: str | None = None


@dataclass(frozen=True)
class Described:
    """One DescribeGroups answer: the group's state and each member's (proof, partitions);
    ``detailed`` is False when the broker answered member ids only (Tansu)."""

    state: str
    members: Mapping[str, tuple[MemberProof | None, frozenset[TP]]]
    detailed: bool


@dataclass(frozen=True)
class Assessment:
    """Whether the input partitions are all in proven workers' hands, and what to tell."""

    unproven_partitions: tuple[str, ...] = ()
    unproven_members: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reasons

    def reason(self) -> str | None:
        return None if self.ok else "; ".join(self.reasons) + f" ({ADVICE})"


def _names(tps: Iterable[TP]) -> tuple[str, ...]:
    return tuple(f"{t}[{p}]" for t, p in sorted(tps))


def _listed(tps: Iterable[TP], most: int = 8) -> str:
    names = _names(tps)
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _from_seal(
    group: str, inputs: frozenset[TP], view: GroupView
) -> tuple[set[TP], set[str], list[str]]:
    """Unproven partitions, unproven members and reasons, from this worker's assignment."""
    if view.seal is None:
        others = set(inputs - view.mine)
        return (
            others,
            set(),
            [
                f"the leader of consumer group {group} did not prove it is a worker of this market "
                f"({view.why_unsealed}): the {len(others)} input partitions this worker was not "
                f"given ({_listed(others)}) may be held by members that are not"
            ],
        )
    seal, reasons = view.seal, []
    held = {tp for ps in seal.members.values() for tp in ps}
    nobody = set(inputs - held)
    if nobody:
        reasons.append(
            f"{len(nobody)} input partitions of consumer group {group} are assigned "
            f"to nobody ({_listed(nobody)})"
        )
    if view.member_id in seal.refused:
        reasons.append(
            f"the leader of consumer group {group} gave this worker nothing: it "
            f"refused its proof ({seal.refused[view.member_id]}; check this "
            f"worker's clock, or whether someone copies its proof)"
        )
    return nobody, set(seal.refused), reasons


def _from_described(
    group: str, inputs: frozenset[TP], described: Described, membership: Membership
) -> tuple[set[TP], set[str], list[str]]:
    """The same from a detailed DescribeGroups answer of a stable group (Apache Kafka)."""
    refused = membership.standing({m: p for m, (p, _) in described.members.items()})
    taken = {tp for m in refused for tp in described.members[m][1] if tp in inputs}
    held = {tp for _, tps in described.members.values() for tp in tps}
    nobody = set(inputs - held)
    reasons = []
    if taken:
        reasons.append(
            f"{len(taken)} input partitions of consumer group {group} ("
            f"{_listed(taken)}) are held by members that did not prove they are "
            f"workers of this market: {', '.join(sorted(refused))}"
        )
    if nobody:
        reasons.append(
            f"{len(nobody)} input partitions of consumer group {group} are assigned "
            f"to nobody ({_listed(nobody)})"
        )
    return taken | nobody, set(refused), reasons


def assess(
    group: str,
    inputs: frozenset[TP],
    view: GroupView | None,
    described: Described | None,
    membership: Membership,
) -> Assessment:
    """Join what the seal and the last DescribeGroups say (see the module docstring).

    Before this worker's first assignment there is no verdict, and a group that is
    rebalancing is not judged by its description (its members' assignments are in flux).
    """
    unproven: set[TP] = set()
    strangers: set[str] = set()
    reasons: list[str] = []
    if view is not None:
        found = _from_seal(group, inputs, view)
        unproven, strangers, reasons = found[0], found[1], found[2]
    if described is not None and described.state.lower() == "stable":
        if described.detailed:
            taken, more, why = _from_described(group, inputs, described, membership)
            unproven |= taken
            strangers |= more
            reasons += [r for r in why if r not in reasons]
        elif view is not None and view.seal is not None:
            known = set(view.seal.members) | set(view.seal.refused)
            strangers |= set(described.members) - known
    return Assessment(_names(unproven), tuple(sorted(strangers)), tuple(reasons))


def described_from(responses: Iterable[Any], group: str) -> Described | None:
    """The group's :class:`Described` from aiokafka's DescribeGroups responses (None if absent).

    Each group is ``(error_code, group, state, protocol_type, protocol, members, ...)``, each
    member ``(member_id, client_id, client_host, member_metadata, member_assignment)``.
    """
    for response in responses:
        for entry in response.groups:
            if entry[1] != group or entry[0] != 0:
                continue
            members = {m[0]: (m[3], m[4]) for m in entry[5]}
            detailed = any(meta for meta, _ in members.values())
            return Described(
                entry[2],
                {m: _member(meta, assigned) for m, (meta, assigned) in members.items()},
                detailed,
            )
    return None


def _member(metadata: bytes, assignment: bytes) -> tuple[MemberProof | None, frozenset[TP]]:
    """A described member's proof (in Faust's JSON user data) and its partitions."""
    proof = None
    tps: frozenset[TP] = frozenset()
    try:
        if metadata:
            proof = proof_in(ConsumerProtocol.METADATA.decode(metadata).user_data)
        if assignment:
            decoded = ConsumerProtocol.ASSIGNMENT.decode(assignment).assignment
            tps = frozenset((t, p) for t, ps in decoded for p in ps)
    except Exception:  # a stranger's bytes: no proof, or no partitions we can name
        log.debug("undecodable member metadata or assignment in DescribeGroups", exc_info=True)
    return proof, tps


@dataclass
class GroupWatch:
    """This worker's side of the membership protocol, and what it knows of the group.

    The assignor (``faust_internals.proving_assignor``) calls :meth:`metadata`, :meth:`judge`,
    :meth:`seal` and :meth:`assigned` on the consumer's thread; the web pages read
    :attr:`assessment`, replaced whole under a lock.
    """

    membership: Membership
    inputs: frozenset[TP]
    metrics: Metrics
    admin_options: dict[str, Any] = field(default_factory=dict, repr=False)
    view: GroupView | None = None
    described: Described | None = None
    assessment: Assessment = field(default_factory=Assessment)
    _admin: AIOKafkaAdminClient | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def group(self) -> str:
        return self.membership.group

    # --- on the consumer's thread, from the assignor --------------------------------------

    def metadata(self, user_data: bytes, member_id: str) -> bytes:
        """This worker's JoinGroup user data with a fresh proof in it."""
        return with_proof(user_data, self.membership.prove(member_id))

    def judge(self, user_data: Mapping[str, bytes], leader_id: str) -> dict[str, str]:
        """As the leader: the members to give nothing (counted and logged), and why."""
        refused = self.membership.judge({m: proof_in(d) for m, d in user_data.items()}, leader_id)
        for member, why in sorted(refused.items()):
            self.metrics.group_refused.labels(why).inc()
            log.warning(
                "consumer group %s: member %s did not prove it is a worker of this "
                "market (%s); it is assigned nothing",
                self.group,
                member,
                why,
            )
        return refused

    def seal(
        self,
        generation: int,
        leader_id: str,
        given: Mapping[str, Iterable[TP]],
        refused: Mapping[str, str],
    ) -> dict[str, Any]:
        """As the leader: the seal every member's assignment carries, as JSON."""
        return make_seal(
            self.membership.key, self.group, generation, leader_id, given, refused
        ).to_json()

    def assigned(self, generation: int, member_id: str, received: Iterable[TP], seal: Any) -> None:
        """This worker's new assignment and the seal it carried (None if it had none)."""
        mine = frozenset(received)
        opened, why = open_seal(self.membership.key, self.group, seal, generation, member_id, mine)
        self.view = GroupView(generation, member_id, mine, opened, why)
        self._update()

    # --- on the event loop -----------------------------------------------------------------

    async def poll(self) -> None:
        """Describe the group once; keep the last answer if the broker does not give one."""
        try:
            if self._admin is None:
                admin = AIOKafkaAdminClient(**self.admin_options)
                try:
                    await admin.start()
                except Exception:
                    await admin.close()
                    raise
                self._admin = admin
            responses = await self._admin.describe_consumer_groups([self.group])
        except Exception as exc:  # the broker probe and its alert report outages
            log.debug("DescribeGroups of %s failed: %r", self.group, exc)
            return
        self.described = described_from(responses, self.group)
        self._update()

    async def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await admin.close()

    def health(self) -> dict[str, Any]:
        """The ``group`` part of ``/health``."""
        a, view = self.assessment, self.view
        return {
            "id": self.group,
            "ok": a.ok,
            "reason": a.reason(),
            "generation": None if view is None else view.generation,
            "leader": None if view is None or view.seal is None else view.seal.leader_id,
            "unproven_partitions": list(a.unproven_partitions),
            "unproven_members": list(a.unproven_members),
        }

    def _update(self) -> None:
        with self._lock:
            before = self.assessment
            now = assess(self.group, self.inputs, self.view, self.described, self.membership)
            self.assessment = now
            self.metrics.group_untrusted.set(0 if now.ok else 1)
            self.metrics.group_unproven_partitions.set(len(now.unproven_partitions))
            self.metrics.group_unproven_members.set(len(now.unproven_members))
        if now.reasons != before.reasons:
            if now.ok:
                log.info(
                    "consumer group %s: every input partition is held by a proven worker again",
                    self.group,
                )
            else:
                log.warning("consumer group %s: %s", self.group, now.reason())
