"""Request keys as docs/protocol.md §1.1 and §1.3 define them, computed from the text alone
with :mod:`hashlib` by ``tests/market/reference_noise.py``: the copied sponge
(``NoiseKeys.of``) and the chain's identity prefix encoded once (``ReleaseChain.key``) must
give the same 32 bytes for every identity, and two different identities must never share an
encoding (so never, but by a SHAKE256 collision, a key)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from market import DiscreteLaplace, Gaussian, Laplace, Poisson
from market._draws import request_key
from market.chain import DOMAIN, ReleaseChain
from market.rng import IdentityPart, NoiseKeys, identity_bytes
from tests.market import reference_noise as ref

Part = str | bytes | int | float

_parts = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
)
_identities = st.lists(_parts, max_size=6).map(tuple)
_secrets = st.binary(min_size=16, max_size=200)


@settings(max_examples=300, deadline=None)
@given(_secrets, st.lists(_identities, min_size=1, max_size=4))
def test_a_copied_sponge_gives_the_key_the_protocol_defines(
    secret: bytes, identities: list[tuple[Part, ...]]
) -> None:
    keys = NoiseKeys(secret)
    for identity in identities * 2:  # every key again: the copied sponge is never consumed
        want = ref.request_key(secret, identity)
        assert keys(*identity) == want
        assert keys.of(identity_bytes(*identity)) == want
        assert request_key(secret, identity_bytes(*identity)) == want


_chains = st.sampled_from(
    [
        ReleaseChain(Laplace(2.0, dimension=3), [0.5, 1.0]),
        ReleaseChain(Laplace(), [0.25, 4.0], sealed=True),
        ReleaseChain(DiscreteLaplace(3), [1.0]),
        ReleaseChain(Gaussian(), [0.1, 0.2, 0.4]),
        ReleaseChain(Poisson(), [1.0, 2.0]),
    ]
)


@settings(max_examples=200, deadline=None)
@given(_secrets, _chains, _identities, st.integers(min_value=0, max_value=63))
def test_a_chain_key_is_the_step_key_of_section_1_3(
    secret: bytes, chain: ReleaseChain, identity: tuple[Part, ...], step: int
) -> None:
    want = ref.request_key(secret, (DOMAIN, chain.fingerprint, *identity, step))
    assert chain.key(NoiseKeys(secret), identity, step) == want


def test_identities_that_look_alike_have_different_encodings_and_keys() -> None:
    """The chain's prefix, the value's parts and the step are concatenated encodings: only the
    tags and lengths of §1.1 keep a part from running into its neighbour."""
    chain = ReleaseChain(Laplace(), [1.0])
    keys = NoiseKeys(b"k" * 32)
    alike: list[tuple[IdentityPart, ...]] = [
        ("ab", "c"),
        ("a", "bc"),
        ("abc",),
        ("a", "b", "c"),
        (b"ab", "c"),
        ("ab", b"c"),
        ("1",),
        (1,),
        (1.0,),
        (b"1",),
        ("", "1"),
        ("1", ""),
        ("s", 1),
        ("s\x00\x00\x00\x011",),
        (-1,),
        ("-1",),
        (10,),
        (1, 0),
        (0.0,),
        (-0.0,),
        (chain.fingerprint,),
        (DOMAIN,),
    ]
    encodings = {identity_bytes(*i) for i in alike}
    assert len(encodings) == len(alike)
    steps = {chain.key(keys, i, s) for i in alike for s in (0, 1, 10)}
    assert len(steps) == 3 * len(alike)
    # a value's parts never pass for the chain's prefix, nor the step for a value part
    assert chain.key(keys, (), 1) != keys(DOMAIN, chain.fingerprint, "1")
    assert chain.key(keys, ("v",), 1) != keys(DOMAIN, chain.fingerprint, "v", "1")
    assert math.copysign(1, -0.0) < 0  # -0.0 and 0.0 are two doubles, two encodings
