"""Timings to believe on a shared machine: warm up until steady, alternate the contestants in rounds,
and report the spread.

A ratio between two implementations timed one after the other (ours, then the peer) measures the
machine as much as the code when another job starts or stops in between. Here every contestant
runs once per round, the order reversed every other round, and each ratio is taken within a round
(both sides under the same load), then summarised over rounds as median [min-max].
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable


def warm_up(step: Callable[[], float | None], window: int = 3, tolerance: float = 0.10, max_steps: int = 30) -> int:
    """Run `step` until the last `window` times agree within `tolerance` (max / min - 1), at most
    `max_steps` times; returns how many ran. `step` may return its own seconds (a subprocess timing
    itself), else it is timed here."""
    times = []
    for n in range(1, max_steps + 1):
        times.append(timed(step))
        recent = times[-window:]
        if len(recent) == window and max(recent) <= (1 + tolerance) * min(recent):
            return n
    return max_steps


def timed(step: Callable[[], float | None]) -> float:
    start = time.perf_counter()
    answer = step()
    return float(answer) if isinstance(answer, (int, float)) else time.perf_counter() - start


def alternate(contestants: dict[str, Callable[[], float | None]], rounds: int, repeats: int = 1,
              report: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Seconds per contestant and round (the median of `repeats` calls), the order reversed every other round."""
    names = list(contestants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            seconds[name].append(statistics.median(timed(contestants[name]) for _ in range(repeats)))
        if report is not None:
            report(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {seconds[n][-1]:.4f} s" for n in names))
    return seconds


def spread(values: list[float]) -> str:
    """"median [min-max]" of a list of figures."""
    return f"{statistics.median(values):.3g} [{min(values):.3g}-{max(values):.3g}]"


def ratios(seconds: dict[str, list[float]], numerator: str, denominator: str) -> list[float]:
    """Round-by-round time ratios numerator / denominator (each pair measured in the same round)."""
    return [a / b for a, b in zip(seconds[numerator], seconds[denominator])]


def load_note() -> str:
    """The 1-minute load average against the CPU count: how busy the machine was."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} CPUs"


VECTOR_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def cpu_note() -> str:
    """The CPU's model name and the vector instructions /proc/cpuinfo lists (what int8 and bf16
    kernels of every runtime choose from: ONNX Runtime and OpenVINO read cpuid, not torch's
    variables), torch's ATen capability and any instruction-set caps set in the environment."""
    name, flags = "unknown CPU", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    listed = [f for f in VECTOR_FLAGS if f in flags]
    caps = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
            if k in os.environ}
    try:
        import torch

        aten = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - a note, never a failure
        aten = "unknown"
    return (f"CPU: {name}; cpuinfo vector flags: {' '.join(listed) or 'none of ' + ', '.join(VECTOR_FLAGS)}; "
            f"ATen capability {aten}" + (f"; caps set: {caps}" if caps else "") + cpuid_note(flags))


def cpuid_note(cpuinfo_flags: set) -> str:
    """What CPUID tells this process, when it hides AVX-512 that /proc/cpuinfo lists (benchmarks/avx2.sh):
    then ONNX Runtime, numpy and OpenVINO run their AVX2 kernels too. numpy's dispatch table reads CPUID."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as seen
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__ as seen
    if "avx512f" in cpuinfo_flags and not seen.get("AVX512F", True):
        return "; CPUID as this process sees it: AVX2 without AVX-512/VNNI (benchmarks/avx2.sh: every runtime's AVX2 kernels)"
    return "; CPUID as this process sees it: the same as cpuinfo (no masking)"

