"""Types of the compiled noise step (market/_cnoise.c); :mod:`market._step` is its caller."""

from collections.abc import Sequence

from typing_extensions import Buffer

def request_keys(head: Buffer, seeds: Sequence[bytes]) -> bytes: ...
def main_words(keys: Buffer, sizes: Sequence[int], slots: int) -> bytearray: ...
def keyed_words(
    head: bytes, seeds: Sequence[bytes], sizes: Sequence[int], slots: int
) -> tuple[bytes, bytearray]: ...
def dlap_segments(
    words: Buffer,
    consts: Buffer,
    sizes: Sequence[int],
    margin: float,
    eta: float,
    libm_error: float = 0.0,
) -> tuple[bytearray, list[int]]: ...
def normals(
    words: Buffer, c_log: float, c_cos: float, two_pi_u64: float
) -> tuple[bytearray, bytearray]: ...
def table_segments(
    words: Buffer, sizes: Sequence[int], tables: Sequence[tuple[Buffer, int, float]]
) -> tuple[bytearray, list[int]]: ...
def gaussian_snap(
    words: Buffer,
    terms: Buffer,
    x: Buffer,
    scale: float,
    consts: tuple[float, float, float],
) -> tuple[bytearray, list[int]] | None: ...
def dlap_plans(
    words: Buffer, sizes: Sequence[int], laws: Sequence[bytes], margin: float, eta: float
) -> tuple[bytearray, list[int]]: ...
def gaussian_pass(
    words: Buffer,
    coef: tuple[float, float],
    x: Buffer,
    scale: float,
    consts: tuple[float, float, float],
    prior: tuple[object, ...] | None,
    z: Buffer,
    err: Buffer,
    out: Buffer,
) -> list[int] | None: ...
def wide() -> bool: ...
