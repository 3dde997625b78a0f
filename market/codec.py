"""Compact, versioned binary form of a :class:`~market.release_state.ReleaseState`.

Layout of format version 1 (all integers little-endian)::

    magic      4s   b"EMRS"
    version    u8   1
    mechanism  u8   Mechanism.code (1 laplace, 2 gaussian, 3 poisson)
    flags      u8   bit 0: exact value present, bit 1: cap present, bit 2: the mechanism's
                    stable samplers (``Poisson(thinning="numpy")``: :meth:`Mechanism.stable`)
    reserved   u8   0
    dimension  u32
    sensitivity f64
    cap        f64  (0.0 when absent)
    m          u32  number of released levels
    levels     m × f64, increasing
    exact      dimension × item      (if flag bit 0)
    releases   m blocks, most accurate first; each is
                 kind u8 = 0 dense:  dimension × item
                 kind u8 = 1 sparse: count u32, count × u32 indices, count × item values
               where a sparse block lists the coordinates that differ from the block before it
               (the exact value for the first block, when present)
    crc32      u32  of everything before it

``item`` is f64 for Laplace/Gaussian and i64 for Poisson. Sparse blocks are what make the lazy
Laplace process cheap to store: a relaxation ε1 → ε2 keeps about (ε1/ε2)² of the coordinates, so
a chain of close levels costs little more than one vector. Values are stored bit for bit.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .chain import ChainState
from .errors import MarketError, StateFormatError
from .histogram_chain import HistogramValue
from .levels import MAX_DIMENSION, canonical_level
from .mechanisms import MECHANISMS, Mechanism
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

FORMAT_VERSION = 1
SPARSE_MIN_DIMENSION = 64
_MAGIC = b"EMRS"
_HEADER = struct.Struct("<4sBBBBIddI")
_BY_CODE = {cls.code: cls for cls in MECHANISMS.values()}
_DENSE, _SPARSE = 0, 1
_STABLE = 4
"""Flag bit: the state's mechanism draws with its stable samplers (its default does not)."""
_KNOWN_FLAGS = 1 | 2 | _STABLE


def _item(mech: Mechanism) -> np.dtype[Any]:
    return np.dtype("<i8") if mech.dtype is np.int64 else np.dtype("<f8")


def encode_state(state: ReleaseState) -> bytes:
    """Serialise a release state in the compact format of this module.

    Parameters
    ----------
    state : ReleaseState
        Any state, open or sealed.

    Returns
    -------
    bytes
        Format version 1 (see the module docstring); :func:`decode_state` gives back a state
        equal bit for bit (:meth:`ReleaseState.equals`).
    """
    mech = state.mechanism
    item = _item(mech)
    exact = state.exact
    flags = (1 if exact is not None else 0) | (2 if state.cap is not None else 0)
    if getattr(mech, "thinning", None) == "numpy":
        flags |= _STABLE  # later draws must come from the same samplers after a round trip
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
        parts.append(exact.astype(item, copy=False).tobytes())
    reference: NDArray[Any] | None = exact
    dense_cost = state.dimension * item.itemsize
    # Looking for shared coordinates costs a few numpy calls per level; below this size the
    # savings are a few bytes and the calls dominate (this runs on every state write).
    try_sparse = state.dimension >= SPARSE_MIN_DIMENSION
    for lvl in reversed(levels):
        values = state.get(lvl)
        assert values is not None
        if try_sparse and reference is not None:
            idx = np.flatnonzero(values.view(np.uint64) != reference.view(np.uint64))
            if 4 + idx.shape[0] * (4 + item.itemsize) < dense_cost:
                parts += [
                    struct.pack("<BI", _SPARSE, idx.shape[0]),
                    idx.astype("<u4").tobytes(),
                    values[idx].astype(item, copy=False).tobytes(),
                ]
                reference = values
                continue
        parts += [struct.pack("<B", _DENSE), values.astype(item, copy=False).tobytes()]
        reference = values
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
            f"release state format version {version} is not supported "
            f"(this library reads version {FORMAT_VERSION})"
        )
    if code not in _BY_CODE:
        raise StateFormatError(f"unknown mechanism code {code}")
    if not 0 < dim <= MAX_DIMENSION:
        raise StateFormatError(f"implausible dimension {dim}")
    if flags & ~_KNOWN_FLAGS:
        raise StateFormatError(f"unknown flags {flags:#04x} in the release state header")
    try:
        mech: Mechanism = _BY_CODE[code](sensitivity=sens)
        if flags & _STABLE:
            mech = mech.stable()
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
    item = _item(mech)
    native = np.dtype(mech.dtype)
    exact = r.array(dim, item).astype(native) if flags & 1 else None
    releases: dict[float, NDArray[Any]] = {}
    reference = exact
    for lvl in reversed(levels):
        reference = releases[lvl] = _block(r, dim, item, native, reference)
    if r.pos != len(body):
        raise StateFormatError("trailing bytes after the release state")
    return ReleaseState._restore(mech, dimension=dim, exact=exact, cap=cap_level, releases=releases)


def _framed(data: bytes, magic: bytes, header: int, what: str) -> bytes:
    """The body of a record framed as ``magic · header · … · crc32``, checked."""
    if len(data) < header + 4 or data[:4] != magic:
        raise StateFormatError(f"not a {what} (bad magic bytes or too short)")
    body, (crc,) = data[:-4], struct.unpack("<I", data[-4:])
    if zlib.crc32(body) != crc:
        raise StateFormatError(f"{what} is corrupt (checksum mismatch)")
    return body


# -- chain states ---------------------------------------------------------------------------
CHAIN_FORMAT_VERSION = 1
_CHAIN_MAGIC = b"EMCS"
_CHAIN_HEADER = struct.Struct("<4sBBBBI")


def encode_chain_state(state: ChainState) -> bytes:
    """Serialise a :class:`~market.chain.ChainState` (a value's cached chain).

    Layout of chain format version 1 (little-endian)::

        magic "EMCS" · version u8 · flags u8 (bit 0: exact present, bit 1: int64 items) ·
        reserved u8 · count u8 · dimension u32 · count × u8 cached steps (increasing) ·
        exact (dimension × item, if present) · one block per cached step, in step order,
        dense or sparse against the block before it · crc32 u32

    ``item`` is f64, or i64 for Poisson counts. Consecutive Laplace steps share about
    (l_{k−1}/l_k)² of their coordinates, which the sparse blocks store once.
    """
    exact = state.exact
    steps = sorted(state.steps)
    first = exact if exact is not None else state.steps[steps[0]]
    counts = first.dtype == np.int64
    item = np.dtype("<i8") if counts else np.dtype("<f8")
    dim = int(first.shape[0])
    flags = (1 if exact is not None else 0) | (2 if counts else 0)
    parts: list[bytes] = [
        _CHAIN_HEADER.pack(_CHAIN_MAGIC, CHAIN_FORMAT_VERSION, flags, 0, len(steps), dim),
        bytes(steps),
    ]
    if exact is not None:
        parts.append(exact.astype(item, copy=False).tobytes())
    reference: NDArray[Any] | None = None
    for k in steps:
        values = state.steps[k]
        parts += _block_bytes(values, reference, item, dim)
        reference = values
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def _block_bytes(
    values: NDArray[Any], reference: NDArray[Any] | None, item: np.dtype[Any], dim: int
) -> list[bytes]:
    if reference is not None and dim >= SPARSE_MIN_DIMENSION:
        idx = np.flatnonzero(values.view(np.uint64) != reference.view(np.uint64))
        if 4 + idx.shape[0] * (4 + item.itemsize) < dim * item.itemsize:
            return [
                struct.pack("<BI", _SPARSE, idx.shape[0]),
                idx.astype("<u4").tobytes(),
                values[idx].astype(item, copy=False).tobytes(),
            ]
    return [struct.pack("<B", _DENSE), values.astype(item, copy=False).tobytes()]


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
            f"chain state format version {version} is not supported "
            f"(this library reads version {CHAIN_FORMAT_VERSION})"
        )
    if not 0 < dim <= MAX_DIMENSION:
        raise StateFormatError(f"implausible dimension {dim}")
    steps = list(r.take(count))
    if any(a >= b for a, b in itertools.pairwise(steps)):
        raise StateFormatError("chain state steps are not strictly increasing")
    native = np.dtype(np.int64) if flags & 2 else np.dtype(np.float64)
    item = np.dtype("<i8") if flags & 2 else np.dtype("<f8")
    exact = r.array(dim, item).astype(native) if flags & 1 else None
    cached: dict[int, NDArray[Any]] = {}
    reference: NDArray[Any] | None = None
    for k in steps:
        reference = _block(r, dim, item, native, reference)
        reference.setflags(write=False)
        cached[k] = reference
    if r.pos != len(body):
        raise StateFormatError("trailing bytes after the chain state")
    if exact is not None:
        exact.setflags(write=False)
    elif not cached:
        raise StateFormatError("a chain state needs its exact value or a cached step")
    state = ChainState(exact, cached)
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
