"""Group membership proofs and the leader's seal, without a broker (docs/protocol.md §13).

The format's test vectors against the code and against HMACs computed from the text alone;
every rule a leader judges a member by; the seal a worker opens; what a worker concludes from
its seal and from DescribeGroups (Kafka's detailed answer, Tansu's member ids); Faust's assignor
with the proofs, on a real Faust app; and aiokafka's first join, which is why a first proof
cannot name its member id.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import zlib
from typing import Any

import faust
import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocol,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.admin import DescribeGroupsResponse_v2
from aiokafka.protocol.group import JoinGroupResponse_v5
from faust.assignor.client_assignment import ClientMetadata

from streams.worker import faust_internals
from streams.worker.assignment_seal import SEAL_FIELD, make_seal, open_seal
from streams.worker.assignment_seal import covered as seal_covered
from streams.worker.group_watch import Described, GroupView, GroupWatch, assess, described_from
from streams.worker.membership import PROOF_FIELD, Membership, covered, proof_in, with_proof
from streams.worker.metrics import build_metrics
from streams.worker.secrets import MEMBERSHIP_LABEL, membership_key

from ..helpers import protocol_vectors
from ..rogue_member import faust_like_metadata

KEY = membership_key(bytes(range(32)))
NOW = 1_767_225_600_000
GROUP = "epsilon-market"
INPUTS = frozenset((f"m.{t}", p) for t in ("accounts", "purchases") for p in range(2))


def worker(nonce: int, now: int = NOW) -> Membership:
    return Membership(KEY, GROUP, window_ms=90_000, clock=lambda: now, nonce=bytes([nonce]) * 16)


def doc_vectors() -> dict[str, Any]:
    return protocol_vectors("membership")


def lp(text: str) -> bytes:
    return len(text.encode()).to_bytes(2, "big") + text.encode()


def proof_from_the_text(secret: bytes, group: str, nonce: bytes, issued: int, member: str) -> bytes:
    """docs/protocol.md §13.1–13.2, written from the text, not from the module."""
    k = hmac.new(secret, b"emarket membership key v1", hashlib.sha256).digest()
    c = b"emarket-member-v1" + lp(group) + nonce + issued.to_bytes(8, "big") + lp(member)
    return hmac.new(k, c, hashlib.sha256).digest()


def seal_from_the_text(secret: bytes, v: dict[str, Any]) -> bytes:
    """docs/protocol.md §13.3, from the text."""
    k = hmac.new(secret, b"emarket membership key v1", hashlib.sha256).digest()
    s = b"emarket-seal-v1" + lp(v["group"]) + v["generation"].to_bytes(4, "big") + lp(v["leader"])
    ids = sorted({*v["members"], *v["refused"]}, key=str.encode)
    s += len(ids).to_bytes(4, "big")
    for m in ids:
        pairs = sorted(v["members"].get(m, []), key=lambda tp: (tp[0].encode(), tp[1]))
        s += lp(m) + lp(v["refused"].get(m, "")) + len(pairs).to_bytes(4, "big")
        s += b"".join(lp(t) + p.to_bytes(4, "big") for t, p in pairs)
    return hmac.new(k, s, hashlib.sha256).digest()


def test_the_documented_vectors_are_what_the_code_and_the_text_compute() -> None:
    v = doc_vectors()
    secret = bytes.fromhex(v["noise_secret"])
    assert membership_key(secret).hex() == v["membership_key"]
    for p in v["proofs"]:
        m = Membership(membership_key(secret), p["group"], nonce=bytes.fromhex(p["nonce"]))
        assert covered(p["group"], m.nonce, p["issued_ms"], p["member_id"]).hex() == p["covered"]
        assert m.tag(m.nonce, p["issued_ms"], p["member_id"]).hex() == p["tag"]
        text = proof_from_the_text(secret, p["group"], m.nonce, p["issued_ms"], p["member_id"])
        assert text.hex() == p["tag"]
    s = v["seal"]
    members = {m: [tuple(tp) for tp in tps] for m, tps in s["members"].items()}
    made = make_seal(
        membership_key(secret), s["group"], s["generation"], s["leader"], members, s["refused"]
    )
    assert (
        seal_covered(s["group"], s["generation"], s["leader"], made.members, made.refused).hex()
        == s["covered"]
    )
    assert made.tag.hex() == s["tag"] == seal_from_the_text(secret, s).hex()


OTHER_LABELS = (
    b"emarket state-mac key v1",
    b"emarket state seal key v2",
    b"emarket state digest key v2",
    b"emarket noise-secret fingerprint v1",
    b"emarket operator token v1",
    b"emarket market sealing key v1",
    b"emarket buyer pseudonym key v1",
    b"emarket receipt opening key v1",
    b"emarket sender key v1",
    b"emarket nonce v1",
)


def test_the_membership_key_is_its_own() -> None:
    """Domain separation: its label is no other derivation's, neither is a prefix of another,
    and the key is neither the secret nor any other key derived from it."""
    assert MEMBERSHIP_LABEL == b"emarket membership key v1"
    for label in OTHER_LABELS:
        assert not (label.startswith(MEMBERSHIP_LABEL) or MEMBERSHIP_LABEL.startswith(label))
    secret = bytes(range(32))
    others = {hmac.new(secret, label, "sha256").digest() for label in OTHER_LABELS}
    assert secret != KEY and KEY not in others
    assert "key" not in repr(worker(1)).lower().replace("membership", "")


def test_a_proof_travels_in_fausts_metadata_and_faust_still_reads_it() -> None:
    data = with_proof(faust_like_metadata("http://w1:6066"), worker(1).prove("m1"))
    assert proof_in(data) == worker(1).prove("m1")
    assert ClientMetadata.loads(data).url == "http://w1:6066"  # Faust keeps what it knows
    assert proof_in(faust_like_metadata()) is None
    assert proof_in(b"\x00not json") is None and proof_in(b"[1]") is None
    bad = json.loads(data)
    bad[PROOF_FIELD]["nonce"] = "zz"
    assert proof_in(json.dumps(bad).encode()) is None


def test_a_leader_accepts_fresh_proofs_bound_or_not() -> None:
    leader, other = worker(1), worker(2)
    proofs = {"l": leader.prove("l"), "a": other.prove(""), "b": worker(3).prove("b")}
    assert leader.judge(proofs, "l") == {}


def test_a_leader_refuses_every_proof_that_does_not_hold() -> None:
    leader = worker(1)
    stranger = Membership(membership_key(b"another secret!!"), GROUP, clock=lambda: NOW)
    elsewhere = Membership(KEY, "another-group", clock=lambda: NOW, nonce=bytes([5]) * 16)
    proofs = {
        "l": leader.prove("l"),
        "none": None,
        "forged": stranger.prove("forged"),
        "group": elsewhere.prove("group"),
        "bound": worker(6).prove("someone-else"),
        "old": worker(7, NOW - 90_001).prove("old"),
        "ahead": worker(8, NOW + 90_001).prove("ahead"),
        "mine": worker(1, NOW - 5).prove(""),  # the leader's nonce under another id
    }
    assert leader.judge(proofs, "l") == {
        "none": "no_proof",
        "forged": "bad_proof",
        "group": "bad_proof",
        "bound": "other_member",
        "old": "stale",
        "ahead": "stale",
        "mine": "impersonated",
    }
    # a stranger that took the leader's member id, with another worker's fresh proof
    assert leader.judge({"l": worker(9).prove("")}, "l") == {"l": "impersonated"}


def test_copies_of_a_proof_are_refused_and_the_bound_original_stays() -> None:
    leader, victim = worker(1), worker(2)
    unbound = victim.prove("")  # what a copier saw of the victim's first join
    assert leader.judge({"l": leader.prove("l"), "v": victim.prove("v"), "x": unbound}, "l") == {
        "x": "duplicate"
    }
    # two unbound copies: nobody can tell the original, both are refused
    assert leader.judge({"l": leader.prove("l"), "v": unbound, "x": unbound}, "l") == {
        "v": "duplicate",
        "x": "duplicate",
    }


def test_a_described_group_is_judged_without_the_clock() -> None:
    me = worker(1, NOW + 3_600_000)  # an hour after everyone's last join
    proofs = {"a": worker(2).prove("a"), "b": worker(3).prove(""), "c": None}
    assert me.standing(proofs) == {"c": "no_proof"}
    assert me.judge(proofs, "a") == {"a": "stale", "b": "stale", "c": "no_proof"}


GIVEN = {
    "w1": [("m.accounts", 0), ("m.purchases", 0), ("cl", 0)],
    "w2": [("m.accounts", 1), ("m.purchases", 1)],
}


def test_a_worker_opens_its_leaders_seal() -> None:
    seal = make_seal(KEY, GROUP, 4, "w1", GIVEN, {"r": "no_proof"}).to_json()
    opened, why = open_seal(KEY, GROUP, seal, 4, "w2", GIVEN["w2"])
    assert why is None and opened is not None and opened.refused == {"r": "no_proof"}
    assert open_seal(KEY, GROUP, seal, 4, "r", [])[1] is None  # a refused member is named
    cases = {
        "its assignment carries no seal": (None, 4, "w2", GIVEN["w2"]),
        "its assignment carries a malformed seal": ({"v": 1}, 4, "w2", GIVEN["w2"]),
        "its seal is of generation 4, not 5": (seal, 5, "w2", GIVEN["w2"]),
        "its seal does not name the partitions": (seal, 4, "w2", GIVEN["w1"]),
    }
    for says, (obj, gen, member, got) in cases.items():
        assert says in str(open_seal(KEY, GROUP, obj, gen, member, got)[1])
    forged = json.loads(json.dumps(seal))
    forged["members"]["w2"].append(["m.accounts", 0])  # a leader that gives itself more
    assert open_seal(KEY, GROUP, forged, 4, "w2", [*GIVEN["w2"], ("m.accounts", 0)])[1] == (
        "its assignment's seal does not verify"
    )
    other = make_seal(membership_key(b"another secret!!"), GROUP, 4, "w1", GIVEN, {}).to_json()
    assert open_seal(KEY, GROUP, other, 4, "w2", GIVEN["w2"])[1] == (
        "its assignment's seal does not verify"
    )


def view(
    member: str,
    mine: list[tuple[str, int]],
    *,
    refused: dict[str, str] | None = None,
    given: dict[str, list[tuple[str, int]]] | None = None,
    sealed: bool = True,
) -> GroupView:
    seal = make_seal(KEY, GROUP, 4, "w1", given or GIVEN, refused or {}) if sealed else None
    return GroupView(4, member, frozenset(mine), seal, None if sealed else "no seal")


def test_a_seal_that_gives_every_input_to_proven_workers_is_trusted() -> None:
    a = assess(GROUP, INPUTS, view("w2", GIVEN["w2"], refused={"r": "no_proof"}), None, worker(1))
    assert a.ok and a.unproven_partitions == () and a.unproven_members == ("r",)
    assert assess(GROUP, INPUTS, None, None, worker(1)).ok  # before the first assignment


def test_under_a_leader_without_a_seal_everything_else_is_suspect() -> None:
    a = assess(GROUP, INPUTS, view("w2", GIVEN["w2"], sealed=False), None, worker(1))
    assert a.unproven_partitions == ("m.accounts[0]", "m.purchases[0]")
    assert f"the leader of consumer group {GROUP} did not prove" in str(a.reason())
    assert "docs/operations.md" in str(a.reason())


def test_partitions_assigned_to_nobody_and_a_refused_worker_are_reported() -> None:
    given = {"w1": [("m.accounts", 0)], "w2": []}
    a = assess(GROUP, INPUTS, view("w2", [], given=given), None, worker(1))
    assert "assigned to nobody" in str(a.reason()) and len(a.unproven_partitions) == 3
    a = assess(GROUP, INPUTS, view("w3", [], refused={"w3": "stale"}), None, worker(1))
    assert not a.ok and "gave this worker nothing" in str(a.reason()) and "stale" in str(a.reason())


def described(state: str, members: dict[str, tuple[bytes, bytes]]) -> Any:
    """A DescribeGroups answer as aiokafka returns it."""
    entries = [
        (m, "client", "/127.0.0.1", meta, assigned) for m, (meta, assigned) in members.items()
    ]
    return DescribeGroupsResponse_v2(
        throttle_time_ms=0, groups=[(0, GROUP, state, "consumer", "faust", entries)]
    )


def kafka_member(user_data: bytes, tps: list[tuple[str, int]]) -> tuple[bytes, bytes]:
    meta = ConsumerProtocol.METADATA(4, ["m.accounts", "m.purchases"], user_data).encode()
    topics: dict[str, list[int]] = {}
    for t, p in tps:
        topics.setdefault(t, []).append(p)
    return meta, ConsumerProtocol.ASSIGNMENT(4, sorted(topics.items()), b"").encode()


def test_kafkas_detailed_description_finds_a_stranger_holding_partitions() -> None:
    proof = with_proof(faust_like_metadata(), worker(2).prove("w2"))
    answer = described(
        "Stable",
        {
            "w2": kafka_member(proof, [("m.accounts", 1), ("m.purchases", 1)]),
            "rogue": kafka_member(faust_like_metadata(), [("m.accounts", 0)]),
            "copy": kafka_member(proof, []),  # a copy of w2's bound proof: another member's
        },
    )
    d = described_from([answer], GROUP)
    assert d is not None and d.detailed and d.members["w2"][0] is not None
    a = assess(GROUP, INPUTS, None, d, worker(1))
    assert a.unproven_partitions == ("m.accounts[0]", "m.purchases[0]")  # taken, and nobody's
    assert a.unproven_members == ("copy", "rogue")
    assert "held by members that did not prove" in str(a.reason()) and "rogue" in str(a.reason())
    assert "assigned to nobody (m.purchases[0])" in str(a.reason())
    rebalancing = Described("PreparingRebalance", d.members, True)
    assert assess(GROUP, INPUTS, None, rebalancing, worker(1)).ok  # in flux: not judged


def test_tansus_member_ids_name_the_members_the_seal_does_not_know() -> None:
    answer = described("Stable", {"w1": (b"", b""), "w2": (b"", b""), "x": (b"", b"")})
    d = described_from([answer], GROUP)
    assert d is not None and not d.detailed
    a = assess(GROUP, INPUTS, view("w2", GIVEN["w2"]), d, worker(1))
    assert a.ok and a.unproven_members == ("x",)
    assert described_from([answer], "another-group") is None


class Cluster:
    """What Faust's assignor reads of aiokafka's cluster metadata."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.topics.get(topic, 0)))


def test_fausts_assignor_with_proofs_gives_a_stranger_nothing_and_seals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topics = ["m.accounts", "m.purchases"]
    watches = [GroupWatch(worker(n), INPUTS, build_metrics()) for n in (1, 2)]
    app = faust.App(
        GROUP,
        broker="kafka://127.0.0.1:9",
        web_enabled=False,
        PartitionAssignor=faust_internals.proving_assignor(watches[0]),
    )
    me = {"id": "w1"}
    monkeypatch.setattr(faust_internals, "group_member", lambda app: (me["id"], 4))
    assignor = app.assignor
    own = assignor.metadata(set(topics))
    other = watches[1].metadata(faust_like_metadata("http://w2:6066"), "")
    members = {
        "w1": own,
        "w2": ConsumerProtocolMemberMetadata(4, topics, other),
        "rogue": ConsumerProtocolMemberMetadata(4, topics, faust_like_metadata()),
    }
    result = assignor.assign(Cluster({t: 2 for t in topics}), members)
    assert result["rogue"].assignment == []
    assert watches[0].metrics.group_refused.labels("no_proof")._value.get() == 1
    given = {m: {(t, p) for t, ps in a.assignment for p in ps} for m, a in result.items()}
    assert given["w1"] | given["w2"] == set(INPUTS) and not given["w1"] & given["w2"]
    for member, watch in (("w1", watches[0]), ("w2", watches[1])):
        seal = json.loads(zlib.decompress(result[member].user_data))[SEAL_FIELD]
        watch.assigned(4, member, given[member], seal)
        assert watch.assessment.ok and watch.assessment.unproven_members == ("rogue",)
    assignor.on_assignment(result["w1"])  # Faust reads its sealed assignment as before
    assert assignor.assigned_actives() == {faust.types.TP(t, p) for t, p in given["w1"]}
    assert json.loads(zlib.decompress(result["rogue"].user_data))["url"] == "http://127.0.0.1:1"


def test_aiokafka_computes_a_first_joins_metadata_before_it_has_a_member_id() -> None:
    """Why a first proof is unbound: aiokafka 0.14 computes the metadata once, before
    JoinGroup, and its KIP-394 retry (Kafka answers MEMBER_ID_REQUIRED to a first JoinGroup v4+)
    resends the same bytes with the member id the broker gave it. (Tansu 0.6 gives the member
    id in its first answer: no retry, measured in tests/streams/worker/test_group_membership.py.)"""
    from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance

    seen: list[tuple[str, bytes]] = []
    asked: list[str] = []

    class Coordinator:
        member_id = ""
        _group_instance_id = None
        _rebalance_timeout_ms = 60_000

        async def _send_req(self, request: Any) -> Any:
            seen.append((request._member_id, request._group_protocols[0][1]))
            if len(seen) == 1:
                return JoinGroupResponse_v5(0, 79, -1, "", "", "member-1", [])
            raise KafkaConnectionError()

    class Assignor:
        name = "faust"

        @staticmethod
        def metadata(topics: Any) -> bytes:
            asked.append(coordinator.member_id)
            return b"metadata"

    class Subscription:
        topics = frozenset({"t"})
        active = True

    coordinator = Coordinator()
    rebalance = CoordinatorGroupRebalance(
        coordinator, GROUP, 0, Subscription(), [Assignor], 3000, 100
    )
    assert asyncio.run(rebalance.perform_group_join()) is None
    assert asked == [""]  # computed once, before the broker named the member
    assert seen == [("", b"metadata"), ("member-1", b"metadata")]  # the retry resends it
