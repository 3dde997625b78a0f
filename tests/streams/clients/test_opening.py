"""Opening an inbox's sealed records with every sealing key held, and saying which key version a
record that none opens was sealed under (docs/protocol.md §4.6, §5.2); no broker."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from market.envelope import seal
from streams.clients.keys import Party, SealingKey
from streams.clients.opening import InboxOpener, Unopened
from streams.wire.events import AccountState, Envelope, ReleasedValue, ValueReleased
from streams.wire.sealing import delivery_aad, releases_json
from streams.wire.signing import key_id_of

K1, K2 = X25519PrivateKey.generate(), X25519PrivateKey.generate()
SIGNING = {1: Party.generate("alice").public_key, 2: Party.generate("alice").public_key}


def account(version: int, key: X25519PrivateKey) -> AccountState:
    return AccountState(
        account_id="alice",
        version=version,
        signing_key=SIGNING[version],
        sealing_key=SealingKey(version, key).public_key,
        key_id=key_id_of(SIGNING[version]),
        opened_at_ms=1,
        updated_at_ms=version,
    )


def delivery(key: X25519PrivateKey, value_id: str) -> ValueReleased:
    plain = releases_json([ReleasedValue(value_id=value_id, seq=1, level=1.0, values=[2.0])])
    env = seal(SealingKey(1, key).public_key, plain, delivery_aad("temp", "alice"))
    return ValueReleased(
        buyer_id="alice",
        stream_id="temp",
        level_unit="epsilon",
        sealed=Envelope.model_validate(env),
    )


INBOX: list[Any] = [
    account(1, K1),
    delivery(K1, "v1"),
    account(2, K2),
    delivery(K1, "v2"),  # sealed in the moment of the rotation: to the old key
    delivery(K2, "v3"),
]


def read(keys: list[SealingKey]) -> tuple[list[str], list[Unopened]]:
    """The releases' value ids in inbox order ("closed" for one not opened), and why not."""
    opener = InboxOpener(keys)
    ids = []
    for ev in INBOX:
        got = opener.open(ev)
        if isinstance(got, Unopened):
            ids.append("closed")
        elif isinstance(got, ValueReleased):
            ids.append(got.releases[0].value_id)
    return ids, opener.unopened


def test_every_held_key_opens_what_was_sealed_to_it() -> None:
    assert read([SealingKey(2, K2), SealingKey(1, K1)]) == (["v1", "v2", "v3"], [])


def test_a_record_no_key_opens_names_its_key_version_and_the_rest_is_read() -> None:
    ids, (first, second) = read([SealingKey(2, K2)])
    assert ids == ["closed", "closed", "v3"]
    assert (first.key_version, first.key_id, first.held) == (1, key_id_of(SIGNING[1]), False)
    assert first.reason == (
        f"its releases are sealed to the account's keys of version 1 (key id "
        f"{key_id_of(SIGNING[1])}), which none of the key files given holds"
    )
    assert first.event is INBOX[1] and first.sealing_key == SealingKey(1, K1).public_key
    assert (second.key_version, second.held) == (2, True)
    assert "in the moment of a rotation" in second.reason


def test_without_a_sealing_key_every_sealed_record_says_so() -> None:
    ids, unopened = read([])
    assert ids == ["closed"] * 3
    assert all("hold no sealing key" in u.reason for u in unopened)
