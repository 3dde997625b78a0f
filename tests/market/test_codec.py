"""Round trips and corruption handling of the release-state codec."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market import Gaussian, Laplace, Poisson, ReleaseState, StateFormatError, default_rng
from market.codec import decode_state, encode_state


@pytest.mark.parametrize("mech", [Laplace(0.5), Gaussian(2.0), Poisson(3.0)], ids=lambda m: m.name)
@pytest.mark.parametrize("sealed", [False, True])
def test_round_trip_is_bitwise(mech: object, sealed: bool) -> None:
    rng = default_rng(1)
    value = np.arange(500)
    if sealed:
        s = ReleaseState.sealed(mech, value, cap=5.0, rng=rng)  # type: ignore[arg-type]
    else:
        s = ReleaseState(mech, value, cap=5.0)  # type: ignore[arg-type]
    for lv in (1.0, 4.0, 0.5, 2.5):
        s.release(lv, rng=rng)
    back = decode_state(encode_state(s))
    assert back.equals(s)
    assert back.cap == 5.0 and back.is_sealed == sealed
    # the restored state continues the same process
    assert back.release(2.5) is back.get(2.5)


def test_a_gaussian_state_continues_its_real_noise_after_a_round_trip() -> None:
    """A Gaussian point stores the real noise its release rounds (its keyed path): a decoded
    state bridges and relaxes from it exactly as the original does."""
    s = ReleaseState(Gaussian(1.0), np.linspace(-2, 2, 300))
    for lv, seed in ((1.0, 1), (4.0, 2)):
        s.release(lv, rng=default_rng(seed))
    back = decode_state(encode_state(s))
    assert back.equals(s)
    for lv, seed in ((2.0, 3), (8.0, 4), (0.5, 5)):
        assert (
            back.release(lv, rng=default_rng(seed)).tobytes()
            == s.release(lv, rng=default_rng(seed)).tobytes()
        )


def test_a_format_v1_state_is_refused_with_what_to_do() -> None:
    import struct
    import zlib

    blob = bytearray(encode_state(ReleaseState(Laplace(), np.zeros(3))))
    blob[4] = 1  # the version byte
    body = bytes(blob[:-4])
    with pytest.raises(StateFormatError, match="noise format v1"):
        decode_state(body + struct.pack("<I", zlib.crc32(body)))


def test_unknown_flags_are_refused() -> None:
    import struct
    import zlib

    blob = bytearray(encode_state(ReleaseState(Laplace(), np.zeros(3))))
    blob[6] |= 0x80  # the flags byte
    body = bytes(blob[:-4])
    with pytest.raises(StateFormatError, match="unknown flags"):
        decode_state(body + struct.pack("<I", zlib.crc32(body)))


def test_lazy_laplace_ladder_is_compact() -> None:
    """Close Laplace levels share most coordinates; the codec stores only the differences."""
    n = 100_000
    s = ReleaseState(Laplace(), np.zeros(n))
    rng = default_rng(2)
    levels = np.linspace(1.0, 1.2, 11)
    for lv in levels:
        s.release(lv, rng=rng)
    blob = encode_state(s)
    dense = (len(levels) + 1) * n * 8
    assert len(blob) < 0.45 * dense, (len(blob), dense)
    assert decode_state(blob).equals(s)


def test_corruption_is_detected() -> None:
    s = ReleaseState(Laplace(), np.zeros(10))
    s.release(1.0, rng=default_rng(0))
    blob = bytearray(encode_state(s))
    blob[40] ^= 0xFF
    with pytest.raises(StateFormatError, match="checksum"):
        decode_state(bytes(blob))
    with pytest.raises(StateFormatError, match="magic"):
        decode_state(b"XXXX" + bytes(blob[4:]))
    with pytest.raises(StateFormatError):
        decode_state(bytes(blob[:20]))


def test_unknown_version_is_refused() -> None:
    import struct
    import zlib

    s = ReleaseState(Laplace(), np.zeros(3))
    blob = bytearray(encode_state(s)[:-4])
    blob[4] = 9
    blob += struct.pack("<I", zlib.crc32(bytes(blob)))
    with pytest.raises(StateFormatError, match="version 9"):
        decode_state(bytes(blob))


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=200))
def test_random_bytes_never_crash(data: bytes) -> None:
    with pytest.raises(StateFormatError):
        decode_state(data)


@settings(max_examples=40, deadline=None)
@given(
    levels=st.lists(st.floats(0.01, 50.0), min_size=1, max_size=8, unique=True),
    dim=st.integers(1, 40),
    seed=st.integers(0, 2**32),
)
def test_round_trip_any_ladder(levels: list[float], dim: int, seed: int) -> None:
    s = ReleaseState(Laplace(), np.linspace(-1, 1, dim))
    rng = default_rng(seed)
    for lv in levels:
        s.release(lv, rng=rng)
    assert decode_state(encode_state(s)).equals(s)
