"""Compact, versioned binary forms of release states, chain states and histogram values.

Layout of release-state format version 2 (all integers little-endian)::

    magic      4s   b"EMRS"
    version    u8   2
    mechanism  u8   Mechanism.code (1 laplace, 2 gaussian, 3 poisson, 4 discrete_laplace)
    flags      u8   bit 0: exact value present, bit 1: cap present
    reserved   u8   0
    dimension  u32
    sensitivity f64
    cap        f64  (0.0 when absent)
    m          u32  number of released levels
    levels     m × f64, increasing
    exact      dimension × item      (if flag bit 0; f64 for Laplace/Gaussian, i64 otherwise)
    points     m blocks of lattice integers (i64), most accurate first; each is
                 kind u8 = 0 dense:  dimension × i64
                 kind u8 = 1 sparse: count u32, count × u32 indices, count × i64 values
               where a sparse block lists the coordinates that differ from the block before it
    paths      Gaussian only, one per level in the same order: count u16, then per term its
               request key (32 bytes) and the rationals q and r, each as numerator and
               denominator (u16 length, big-endian unsigned bytes)
    crc32      u32  of everything before it

Sparse blocks are what make the lazy Laplace process cheap to store: a relaxation ε1 → ε2 keeps
about (ε1/ε2)² of the coordinates. A Gaussian point's path is the real noise its release rounds
(:mod:`market._normal`): it is what later releases are conditioned on. Values are stored bit
for bit; format version 1 (noise format v1) is refused with a message.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._normal import Term
from .chain import ChainState
from .errors import MarketError, StateFormatError
from .histogram_chain import HistogramValue
from .levels import MAX_DIMENSION, canonical_level
from .mechanisms import MECHANISMS, Anchor, Gaussian, Mechanism, mechanism
from .release_state import ReleaseState

__all__ = [
    "CHAIN_FORMAT_VERSION",
    "FORMAT_VERSION",
    "HISTOGRAM_FORMAT_VERSION",
    "decode_chain_state",
    "decode_histogram_value",
    "decode_state",
    "encode_chain_state",
    "encode_histogram_value",
    "encode_state",
]

FORMAT_VERSION = 2
SPARSE_MIN_DIMENSION = 64
_MAGIC = b"EMRS"
_HEADER = struct.Struct("<4sBBBBIddI")
_BY_CODE = {cls.code: cls for cls in MECHANISMS.values()}
_DENSE, _SPARSE = 0, 1
_KNOWN_FLAGS = 1 | 2
_I8 = np.dtype("<i8")


def _item(mech: Mechanism) -> np.dtype[Any]:
    return np.dtype("<i8") if mech.dtype is np.int64 else np.dtype("<f8")


def _sparse_or_dense(
    values: NDArray[np.int64], reference: NDArray[Any] | None, dim: int
) -> list[bytes]:
    """One block of lattice integers: sparse against ``reference`` when that is smaller."""
    if reference is not None and dim >= SPARSE_MIN_DIMENSION and reference.dtype == np.int64:
        idx = np.flatnonzero(values != reference)
        if 4 + idx.shape[0] * 12 < dim * 8:
            return [
                struct.pack("<BI", _SPARSE, idx.shape[0]),
                idx.astype("<u4").tobytes(),
                values[idx].astype(_I8, copy=False).tobytes(),
            ]
    return [struct.pack("<B", _DENSE), values.astype(_I8, copy=False).tobytes()]


def _int_bytes(x: int) -> bytes:
    raw = x.to_bytes(max(1, (x.bit_length() + 7) // 8), "big")
    if len(raw) > 0xFFFF:
        raise StateFormatError("a rational of a Gaussian path is too large to store")
    return struct.pack("<H", len(raw)) + raw


def _path_bytes(path: tuple[Term, ...]) -> list[bytes]:
    out = [struct.pack("<H", len(path))]
    for t in path:
        if t.q < 0 or t.r < 0 or len(t.key) != 32:
            raise StateFormatError("a Gaussian path term is out of range")
        out += [
            t.key,
            _int_bytes(t.q.numerator),
            _int_bytes(t.q.denominator),
            _int_bytes(t.r.numerator),
            _int_bytes(t.r.denominator),
        ]
    return out


def encode_state(state: ReleaseState) -> bytes:
    """Serialise a release state in the compact format of this module.

    Parameters
    ----------
    state : ReleaseState
        Any state, open or sealed.

    Returns
    -------
    bytes
        Format version 2 (see the module docstring); :func:`decode_state` gives back a state
        equal bit for bit (:meth:`ReleaseState.equals`).
    """
    mech = state.mechanism
    exact = state.exact
    flags = (1 if exact is not None else 0) | (2 if state.cap is not None else 0)
    levels = state.levels
    parts: list[bytes] = [
        _HEADER.pack(
            _MAGIC,
            FORMAT_VERSION,
            mech.code,
            flags,
            0,
            state.dimension,
            float(mech.sensitivity),
            state.cap or 0.0,
            len(levels),
        ),
        np.asarray(levels, dtype="<f8").tobytes(),
    ]
    if exact is not None:
        parts.append(exact.astype(_item(mech), copy=False).tobytes())
    reference: NDArray[Any] | None = None
    for lvl in reversed(levels):
        values = state.point(lvl).values
        parts += _sparse_or_dense(values, reference, state.dimension)
        reference = values
    if isinstance(mech, Gaussian):
        for lvl in reversed(levels):
            parts += _path_bytes(state.point(lvl).path)
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise StateFormatError("state is truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def array(self, count: int, dtype: np.dtype[Any] | str) -> NDArray[Any]:
        dt = np.dtype(dtype)
        return np.frombuffer(self.take(count * dt.itemsize), dtype=dt).copy()


def _body(data: bytes) -> bytes:
    """The checked body of an encoded state (magic and checksum verified)."""
    if len(data) < _HEADER.size + 4:
        raise StateFormatError(f"state is {len(data)} bytes, too short to be a release state")
    body, (crc,) = data[:-4], struct.unpack("<I", data[-4:])
    if data[:4] != _MAGIC:
        raise StateFormatError("not a release state (bad magic bytes)")
    if zlib.crc32(body) != crc:
        raise StateFormatError("release state is corrupt (checksum mismatch)")
    return body


def _header(r: _Reader) -> tuple[Mechanism, int, int, float | None, list[float]]:
    """(mechanism, flags, dimension, cap, levels) from the header and level table."""
    _magic, version, code, flags, _, dim, sens, cap, m = _HEADER.unpack(r.take(_HEADER.size))
    if version != FORMAT_VERSION:
        raise StateFormatError(
            f"release state format version {version} is not supported (this library reads "
            f"version {FORMAT_VERSION}, noise format v2; version 1 states were made with noise "
            "format v1, whose samplers this version no longer has: release them again)"
        )
    if code not in _BY_CODE:
        raise StateFormatError(f"unknown mechanism code {code}")
    if not 0 < dim <= MAX_DIMENSION:
        raise StateFormatError(f"implausible dimension {dim}")
    if flags & ~_KNOWN_FLAGS:
        raise StateFormatError(f"unknown flags {flags:#04x} in the release state header")
    try:
        mech = mechanism(_BY_CODE[code].name, sens, dim)
        cap_level = canonical_level(cap, name="cap") if flags & 2 else None
        levels = [canonical_level(x) for x in r.array(m, "<f8").tolist()]
    except MarketError as exc:
        raise StateFormatError(f"release state holds invalid parameters: {exc}") from None
    if any(a >= b for a, b in itertools.pairwise(levels)):
        raise StateFormatError("release state levels are not strictly increasing")
    return mech, flags, dim, cap_level, levels


def _block(
    r: _Reader, dim: int, item: np.dtype[Any], native: np.dtype[Any], reference: NDArray[Any] | None
) -> NDArray[Any]:
    """One release block: dense, or sparse against the block before it."""
    (kind,) = struct.unpack("<B", r.take(1))
    if kind == _DENSE:
        return r.array(dim, item).astype(native)
    if kind == _SPARSE and reference is not None:
        (count,) = struct.unpack("<I", r.take(4))
        idx = r.array(count, "<u4")
        if count and int(idx.max()) >= dim:
            raise StateFormatError("sparse block index out of range")
        values = reference.copy()
        values[idx] = r.array(count, item).astype(native)
        return values
    raise StateFormatError(f"unknown release block kind {kind}")


def decode_state(data: bytes) -> ReleaseState:
    """Parse bytes written by :func:`encode_state`.

    Parameters
    ----------
    data : bytes
        An encoded state.

    Returns
    -------
    ReleaseState

    Raises
    ------
    StateFormatError
        Truncated, corrupt (checksum), of another format version, or holding invalid
        parameters; the message says which.
    """
    body = _body(data)
    r = _Reader(body)
    mech, flags, dim, cap_level, levels = _header(r)
    exact = r.array(dim, _item(mech)).astype(mech.dtype) if flags & 1 else None
    ints: dict[float, NDArray[Any]] = {}
    reference: NDArray[Any] | None = None
    for lvl in reversed(levels):
        reference = ints[lvl] = _block(r, dim, _I8, np.dtype(np.int64), reference)
    paths: dict[float, tuple[Term, ...]] = {}
    if isinstance(mech, Gaussian):
        for lvl in reversed(levels):
            paths[lvl] = _read_path(r)
    if r.pos != len(body):
        raise StateFormatError("trailing bytes after the release state")
    if exact is None and not levels:
        raise StateFormatError("a sealed release state needs a release")
    points = {lvl: Anchor(lvl, v, paths.get(lvl, ())) for lvl, v in ints.items()}
    return ReleaseState._restore(
        mech, dimension=dim, exact=exact, base=None, cap=cap_level, points=points
    )


def _read_int(r: _Reader) -> int:
    (n,) = struct.unpack("<H", r.take(2))
    return int.from_bytes(bytes(r.take(n)), "big")


def _read_path(r: _Reader) -> tuple[Term, ...]:
    (count,) = struct.unpack("<H", r.take(2))
    terms = []
    for _ in range(count):
        key = bytes(r.take(32))
        qn, qd, rn, rd = (_read_int(r) for _ in range(4))
        if qd == 0 or rd == 0:
            raise StateFormatError("a Gaussian path term has a zero denominator")
        terms.append(Term(key, Fraction(qn, qd), Fraction(rn, rd)))
    return tuple(terms)


def _framed(data: bytes, magic: bytes, header: int, what: str) -> bytes:
    """The body of a record framed as ``magic · header · … · crc32``, checked."""
    if len(data) < header + 4 or data[:4] != magic:
        raise StateFormatError(f"not a {what} (bad magic bytes or too short)")
    body, (crc,) = data[:-4], struct.unpack("<I", data[-4:])
    if zlib.crc32(body) != crc:
        raise StateFormatError(f"{what} is corrupt (checksum mismatch)")
    return body


# -- chain states ---------------------------------------------------------------------------
CHAIN_FORMAT_VERSION = 2
_CHAIN_MAGIC = b"EMCS"
_CHAIN_HEADER = struct.Struct("<4sBBBBI")
_EXACT, _EXACT_INT, _PINNED = 1, 2, 4


def encode_chain_state(state: ChainState) -> bytes:
    """Serialise a :class:`~market.chain.ChainState` (a value's cached chain).

    Layout of chain format version 2 (little-endian)::

        magic "EMCS" · version u8 · flags u8 (bit 0: exact present, bit 1: the exact value is
        i64 (else f64), bit 2: pinned, every step a root) · reserved u8 · count u8 ·
        dimension u32 · count × u8 cached steps (increasing) · exact (dimension × item, if
        present) · one block of lattice integers (i64) per cached step, in step order, dense or
        sparse against the block before it · crc32 u32

    Consecutive Laplace steps share about (l_{k−1}/l_k)² of their coordinates, which the
    sparse blocks store once.
    """
    exact = state.exact
    steps = sorted(state.steps)
    dim = int(exact.shape[0]) if exact is not None else int(state.steps[steps[0]].shape[0])
    ints = exact is not None and exact.dtype == np.int64
    flags = (_EXACT if exact is not None else 0) | (_EXACT_INT if ints else 0)
    flags |= _PINNED if state.pinned else 0
    parts: list[bytes] = [
        _CHAIN_HEADER.pack(_CHAIN_MAGIC, CHAIN_FORMAT_VERSION, flags, 0, len(steps), dim),
        bytes(steps),
    ]
    if exact is not None:
        parts.append(exact.astype(_I8 if ints else "<f8", copy=False).tobytes())
    reference: NDArray[Any] | None = None
    for k in steps:
        values = state.steps[k]
        parts += _sparse_or_dense(values, reference, dim)
        reference = values
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def decode_chain_state(data: bytes) -> ChainState:
    """Parse bytes written by :func:`encode_chain_state`.

    Returns
    -------
    ChainState

    Raises
    ------
    StateFormatError
        Truncated, corrupt, of another version, or implausible.
    """
    body = _framed(data, _CHAIN_MAGIC, _CHAIN_HEADER.size, "chain state")
    r = _Reader(body)
    _m, version, flags, _r, count, dim = _CHAIN_HEADER.unpack(r.take(_CHAIN_HEADER.size))
    if version != CHAIN_FORMAT_VERSION:
        raise StateFormatError(
            f"chain state format version {version} is not supported (this library reads "
            f"version {CHAIN_FORMAT_VERSION}, noise format v2)"
        )
    if not 0 < dim <= MAX_DIMENSION:
        raise StateFormatError(f"implausible dimension {dim}")
    if flags & ~(_EXACT | _EXACT_INT | _PINNED):
        raise StateFormatError(f"unknown flags {flags:#04x} in the chain state header")
    steps = list(r.take(count))
    if any(a >= b for a, b in itertools.pairwise(steps)):
        raise StateFormatError("chain state steps are not strictly increasing")
    exact = None
    if flags & _EXACT:
        ints = flags & _EXACT_INT
        exact = r.array(dim, _I8 if ints else "<f8").astype(np.int64 if ints else np.float64)
    cached: dict[int, NDArray[Any]] = {}
    reference: NDArray[Any] | None = None
    for k in steps:
        reference = _block(r, dim, _I8, np.dtype(np.int64), reference)
        reference.setflags(write=False)
        cached[k] = reference
    if r.pos != len(body):
        raise StateFormatError("trailing bytes after the chain state")
    if exact is not None:
        exact.setflags(write=False)
    elif not cached:
        raise StateFormatError("a chain state needs its exact value or a cached step")
    state = ChainState(exact, cached, pinned=bool(flags & _PINNED))
    state.pack()  # a decoded state is at rest
    return state


# -- histogram values ------------------------------------------------------------------------
HISTOGRAM_FORMAT_VERSION = 1
_HIST_MAGIC = b"EMHV"
_HIST_HEADER = struct.Struct("<4sBBHI")


def encode_histogram_value(value: HistogramValue) -> bytes:
    """Serialise a :class:`~market.histogram_chain.HistogramValue` (a histogram's exact counts).

    Layout of histogram format version 1 (little-endian)::

        magic "EMHV" · version u8 · reserved u8 · reserved u16 · count u32 ·
        count × i64 keys (increasing) · count × f64 counts · crc32 u32

    Nothing else is stored: every release is recomputed from the counts
    (:meth:`~market.histogram_chain.HistogramChain.release`).
    """
    n = int(value.keys.size)
    body = b"".join(
        [
            _HIST_HEADER.pack(_HIST_MAGIC, HISTOGRAM_FORMAT_VERSION, 0, 0, n),
            value.keys.astype("<i8", copy=False).tobytes(),
            value.counts.astype("<f8", copy=False).tobytes(),
        ]
    )
    return body + struct.pack("<I", zlib.crc32(body))


def decode_histogram_value(data: bytes) -> HistogramValue:
    """Parse bytes written by :func:`encode_histogram_value`.

    Raises
    ------
    StateFormatError
        Truncated, corrupt, of another version, or not a valid histogram.
    """
    body = _framed(data, _HIST_MAGIC, _HIST_HEADER.size, "histogram value")
    r = _Reader(body)
    _m, version, _r1, _r2, n = _HIST_HEADER.unpack(r.take(_HIST_HEADER.size))
    if version != HISTOGRAM_FORMAT_VERSION:
        raise StateFormatError(
            f"histogram format version {version} is not supported "
            f"(this library reads version {HISTOGRAM_FORMAT_VERSION})"
        )
    if n > MAX_DIMENSION:
        raise StateFormatError(f"implausible number of keys {n}")
    keys = r.array(n, "<i8").astype(np.int64)
    counts = r.array(n, "<f8").astype(np.float64)
    if r.pos != len(body):
        raise StateFormatError("trailing bytes after the histogram value")
    if n > 1 and bool((keys[1:] <= keys[:-1]).any()):
        raise StateFormatError("histogram keys are not strictly increasing")
    keys.setflags(write=False)
    counts.setflags(write=False)
    return HistogramValue(keys, counts)
