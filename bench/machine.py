"""The machine a benchmark ran on, and the CPU time its processes used (Linux ``/proc``).

Every timing benchmark prints :meth:`Machine.line` under its tables: the CPU model, the SIMD
level the CPU offers and the one numpy's kernels run at, and the load average when the
benchmark started and when it ended. Ratios of samplers to numpy differ between CPUs (numpy's
AVX-512 kernels against ours, which are not all vectorised), and a wall-clock figure taken on a
loaded machine measures the neighbours: the line says which machine, and how busy it was.

:func:`cpu_seconds` and :class:`Meter` read the user + system CPU time of processes from
``/proc/<pid>/stat`` (psutil is not a dependency). Unlike wall-clock time it does not count the
time other processes hold the cores, but it still grows with their load (caches and memory
bandwidth are shared, and this VM exposes no instruction counters to count instead): compare
CPU figures only between runs at similar load, which is why the line gives it.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Machine", "Meter", "Usage", "cpu_seconds", "load_1min"]

_X86_LEVELS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"))
_ARM_LEVELS = (("sve2", "SVE2"), ("sve", "SVE"), ("asimd", "NEON"))


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_model(info: Mapping[str, str]) -> str:
    """The model name, with family and model numbers (a VM often shows only "AMD EPYC")."""
    name = info.get("model name") or info.get("Model") or platform.processor() or "unknown CPU"
    numbers = [f"{k} {info[k]}" for k in ("cpu family", "model") if k in info]
    hypervisor = "hypervisor" in info.get("flags", "").split()
    extra = ", ".join(numbers + (["virtual machine"] if hypervisor else []))
    return f"{name} ({extra})" if extra else name


def _simd(info: Mapping[str, str]) -> str:
    """The widest SIMD extension the CPU reports (x86 ``flags``, Arm ``Features``)."""
    flags = set((info.get("flags") or info.get("Features") or "").split())
    for flag, name in (*_X86_LEVELS, *_ARM_LEVELS):
        if flag in flags:
            return name
    return "none reported" if flags else platform.machine()


def _numpy_simd() -> str:
    """The best of numpy's dispatched kernel targets this CPU runs, and numpy's baseline.

    numpy ≥ 2 keeps the table in ``numpy._core``, numpy 1 in ``numpy.core``.
    """
    import numpy as np

    umath: object = None
    for name in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            umath = importlib.import_module(name)
            break
        except ImportError:
            continue
    features: dict[str, bool] = getattr(umath, "__cpu_features__", {})
    baseline: list[str] = list(getattr(umath, "__cpu_baseline__", []))
    dispatch: list[str] = list(getattr(umath, "__cpu_dispatch__", []))
    runs = [t for t in dispatch if features.get(t)]
    best = runs[-1] if runs else (baseline[-1] if baseline else "none")
    base = baseline[-1] if baseline else "none"
    return f"numpy {np.__version__} kernels {best} (baseline {base})"


def _loadavg() -> tuple[float, float, float]:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return float("nan"), float("nan"), float("nan")
    return one, five, fifteen


def load_1min() -> float:
    """The 1-minute load average now (NaN where the system has none)."""
    return _loadavg()[0]


@dataclass(frozen=True)
class Machine:
    """What a benchmark ran on; take it with :meth:`now` before measuring."""

    cpu: str
    cores: int
    simd: str
    numpy: str
    load_start: tuple[float, float, float]

    @classmethod
    def now(cls) -> Machine:
        info = _cpuinfo()
        return cls(_cpu_model(info), os.cpu_count() or 1, _simd(info), _numpy_simd(), _loadavg())

    def line(self) -> str:
        """One line for under a table: the machine, and its load average (1, 5, 15 min) at the
        start and now, the end; flagged when more was runnable than there are cores."""
        now = _loadavg()
        start = " / ".join(f"{x:.2f}" for x in self.load_start)
        end = " / ".join(f"{x:.2f}" for x in now)
        busy = max(self.load_start[0], now[0]) > self.cores
        return (
            f"machine: {self.cpu}, {self.cores} cores, SIMD {self.simd}, {self.numpy}; "
            f"load average (1 / 5 / 15 min) {start} at start, {end} at end"
            + (
                f" (BUSY: load above {self.cores} cores; CPU time per event grows too, "
                "compare only runs at similar load)"
                if busy
                else ""
            )
        )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, all its threads (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


@dataclass(frozen=True)
class Usage:
    """CPU seconds each group of processes used over a window of ``wall_s`` seconds."""

    wall_s: float
    cpu_s: dict[str, float]

    def cores(self, name: str) -> float:
        """How many cores ``name`` kept busy on average over the window."""
        return self.cpu_s[name] / self.wall_s if self.wall_s > 0 else 0.0


class Meter:
    """CPU time of named groups of processes over windows of a benchmark.

    Parameters
    ----------
    pids : mapping of str to sequence of int
        Each group's processes (the benchmark's own: ``os.getpid()``).
    """

    def __init__(self, pids: Mapping[str, Sequence[int]]) -> None:
        self.pids = {name: list(group) for name, group in pids.items()}
        self._start: tuple[float, dict[str, float]] | None = None

    def _read(self) -> tuple[float, dict[str, float]]:
        cpu = {name: sum(cpu_seconds(p) for p in group) for name, group in self.pids.items()}
        return time.perf_counter(), cpu

    def start(self) -> None:
        """Open a window."""
        self._start = self._read()

    def stop(self) -> Usage:
        """Close the window opened by :meth:`start`: what each group used over it."""
        assert self._start is not None, "stop() without start()"
        (t0, c0), (t1, c1) = self._start, self._read()
        self._start = None
        return Usage(t1 - t0, {name: c1[name] - c0[name] for name in c0})

    async def quiet(self, seconds: float) -> Usage:
        """What each group uses over ``seconds`` of this event loop doing nothing but what
        is already running (pollers keep polling): the idle rate a loaded window is net of."""
        self.start()
        await asyncio.sleep(seconds)
        return self.stop()
