"""Which device and which precision a run uses: one rule for train.py, evaluate.py, `vitpose.cli.tune`,
`vitpose predict` and `Predictor` (`resolve_device`, `resolve_precision`, `cpu_has_native_bf16`)."""

from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger(__name__)


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """`"auto"` / None -> CUDA when available, else CPU; `"cpu"`, `"cuda"`, `"cuda:N"` as given.

    A CUDA device without an index gets the current one, so the result names a concrete device.
    Asking for CUDA on a machine without it raises ValueError naming the request (instead of
    torch's lazy failure at the first tensor moved there).
    """
    text = "auto" if spec is None else str(spec)
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError as e:
        raise ValueError(f"device {text!r} is not a device torch knows ({e}); use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {text!r} was asked for but CUDA is not available here; use auto or cpu")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= torch.cuda.device_count():
            raise ValueError(f"device {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


# Person crops per forward pass of `Predictor` when the caller does not say (`--batch-size`).
# On a CPU a ViT forward is fastest per crop at 8-32 crops and ~20-30% slower at 64-128 (the
# activations of a big batch leave the caches; benchmarks/BENCHMARKS.md "Crops per forward pass"),
# and the flip test doubles the batch: 8 boxes = 16 crops. A GPU wants large batches.
DEFAULT_BOXES_PER_PASS = {"cpu": 8, "cuda": 32}


def default_batch_size(device) -> int:
    """Boxes per forward pass of the pose model on `device` (a torch.device or its type name)."""
    kind = device if isinstance(device, str) else torch.device(device).type
    return DEFAULT_BOXES_PER_PASS.get(kind, 32)


# ----------------------------------------------------------------------------------------------
# Numeric precision of inference: one rule for `vitpose predict`, evaluation and `Predictor`.

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# The reduced precisions `auto` may pick, in order of preference, per device type. Each one is
# backed by the accuracy gate (benchmarks/precision_gate.py, tests/test_precision.py: AP within 0.002
# of fp32 on trained models, figures in BENCHMARKS.md); a precision whose gate fails is taken out of
# this table. The gate is decided on validation sets large enough to decide it (the AP difference's
# 95% bootstrap interval at most 0.002 in half-width): ViTPose-S trained on the demo's set
# (configs/demo_vitpose-s.yaml), 3000 images: bf16 +0.0003 [-0.0007, +0.0019]; the demo model, 1000
# images: bf16 +0.0001, fp16 +0.0001; fp16 on ViTPose-S, 1000 images: -0.0003. (The demo's own 100
# images cannot decide it: bf16 +0.0028 there, interval [-0.0011, +0.0075].) fp16 is not in the CPU
# row: a CPU runs it slower than fp32 (0.9x on AVX512-FP16).
AUTO_PRECISIONS = {"cpu": ("bf16",), "cuda": ("fp16",)}

# oneDNN ISA limits (ONEDNN_MAX_CPU_ISA) under which oneDNN, which runs bf16 matmuls and convolutions,
# has no bf16 dot-product instructions, and ATen CPU capabilities below AVX-512.
_ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")
_ATEN_CAPABILITIES_WITHOUT_BF16 = ("DEFAULT", "AVX2", "ZVECTOR", "NO AVX")


def cpu_has_native_bf16() -> bool:
    """True when this CPU runs bf16 matmuls natively (x86: AVX512-BF16 or AMX; other ISAs: assumed).

    The one rule of "native bf16" (`--amp` in training, `precision="auto"` in inference). A CPU
    that has the instructions but whose libraries are told not to use them (the environment
    variables `ONEDNN_MAX_CPU_ISA=AVX2`, `ATEN_CPU_CAPABILITY=avx2`, as when emulating an AVX2
    machine) emulates bf16, which is slower than fp32.
    """
    import os
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if not any(probe() for probe in probes if probe is not None):
        return False
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper() in _ONEDNN_ISAS_WITHOUT_BF16:
        return False
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")()
    return capability.upper() not in _ATEN_CAPABILITIES_WITHOUT_BF16


# ----------------------------------------------------------------------------------------------
# Whether bf16 is faster on this CPU: measured once, cached.
#
# Native bf16 instructions are not the same as a faster model. On AMX (Sapphire Rapids) ViTPose-S
# runs 2.1-2.6x faster in bf16; on an AMD EPYC with AVX512-BF16 and no AMX a 2048x2048 bf16 matmul
# runs 3.7x faster than fp32 while whole-model timings ranged 0.74-1.2x (BENCHMARKS.md): the model's
# layer norms, softmax, GELU and the casts autocast inserts around every matmul eat what the matmuls
# gain. So `auto` takes bf16 on a CPU only where a measurement of the model's own forward says it is
# faster. Why a measurement and not a table of CPUs: the figure depends on the CPU, the torch
# (oneDNN) build, the thread count and the model, and one family of CPUs holds several answers (Zen 4
# runs AVX-512 on 256-bit units, Zen 5 on 512-bit ones); a table would cover the machines someone
# benchmarked and guess for the rest. The measurement costs a few seconds once per CPU model, torch
# version, thread count and model, and is kept in the user's cache folder
# (`precision_cache_path()`); `VITPOSE_CPU_BF16=faster|slower` decides without measuring.

BF16_MIN_SPEEDUP = 1.1  # bf16 costs a little accuracy (within the gate): taken only when clearly faster
SPEED_ROUNDS = 5  # alternating fp32/bf16 rounds after one warm-up call of each (benchmarks/rounds.py's protocol)
CACHE_FILE = "cpu-precision.json"
_speed_memo: dict[str, dict] = {}
_said: set[str] = set()


def precision_cache_path():
    """Where the measured bf16 speed-ups are kept: `$VITPOSE_CACHE_DIR`, else `$XDG_CACHE_HOME/vitpose`,
    else `~/.cache/vitpose`, file `cpu-precision.json`."""
    import os
    from pathlib import Path

    folder = os.environ.get("VITPOSE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vitpose")
    return Path(folder) / CACHE_FILE


def cpu_model_name() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name", else platform.processor())."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _proxy_step():
    """A stand-in for the model when the caller has none: four ViT-S blocks (384 channels, 6 heads,
    MLP 1536) on 4 crops of 256x192 (192 tokens): the matmuls, norms and softmax a ViTPose forward is made of."""
    torch.manual_seed(0)
    blocks = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(
        384, 6, 1536, dropout=0.0, activation="gelu", batch_first=True, norm_first=True), 4,
        enable_nested_tensor=False).eval()
    tokens = torch.randn(4, 192, 384)
    return lambda: blocks(tokens)


def _measure_bf16_speedup(step, rounds: int = SPEED_ROUNDS) -> dict:
    """fp32 time / bf16 time of `step()` per round (alternating, the order reversed every other round,
    each ratio within one round: the same load on both), after one warm-up call of each."""
    import os
    import statistics
    import time

    def once(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            step()
        return time.perf_counter() - start

    once(False), once(True)
    ratios = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        seconds = {bf16: once(bf16) for bf16 in order}
        ratios.append(seconds[False] / seconds[True])
    try:
        load = round(os.getloadavg()[0], 1)
    except OSError:
        load = None
    return {"speedup": statistics.median(ratios), "rounds": [round(x, 3) for x in ratios], "load": load}


def _speed_key(step_name: str) -> str:
    return f"{cpu_model_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads | {step_name}"


def _read_cache() -> dict:
    import json

    try:
        data = json.loads(precision_cache_path().read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measured again and rewritten
    return data if isinstance(data, dict) else {}


def _write_cache(key: str, figure: dict) -> None:
    """Adds one figure to the cache file (a new file written beside it and renamed over it); a cache
    that cannot be written only costs a measurement next time."""
    import json
    import os
    import tempfile

    path = precision_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**_read_cache(), key: figure}
        fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # O_EXCL, random name
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(staged, path)
    except OSError as e:
        log.debug("precision cache %s not written: %s", path, e)


def cpu_bf16_speedup(step=None, step_name: str | None = None) -> dict:
    """{"speedup": fp32 time / bf16 time, "rounds": [...], "load", "source"} of `step` on this CPU.

    `step()` runs one forward of the model (autocast is set around it); None: `_proxy_step()`. The
    figure is kept per CPU model, torch version, thread count and `step_name` in memory and in
    `precision_cache_path()`; `VITPOSE_CPU_BF16=faster|slower` overrides it (no measurement).
    """
    import os

    forced = os.environ.get("VITPOSE_CPU_BF16", "").strip().lower()
    if forced in ("faster", "slower"):
        return {"speedup": float("inf") if forced == "faster" else 0.0, "rounds": [], "load": None,
                "source": f"VITPOSE_CPU_BF16={forced}"}
    if forced:
        raise ValueError(f"VITPOSE_CPU_BF16={forced!r}: use faster or slower (or unset it to measure)")
    name = step_name or ("ViT-S blocks x4, 4 crops" if step is None else "the model's forward")
    key = _speed_key(name)
    if key not in _speed_memo:
        cached = _read_cache().get(key)
        if isinstance(cached, dict) and isinstance(cached.get("speedup"), (int, float)):
            _speed_memo[key] = {**cached, "source": f"measured earlier ({precision_cache_path()})"}
        else:
            figure = _measure_bf16_speedup(step if step is not None else _proxy_step())
            _write_cache(key, figure)
            _speed_memo[key] = {**figure, "source": "measured now"}
    return _speed_memo[key]


def _say_once(text: str) -> None:
    """The reason behind `auto`'s choice: logged once per process (INFO) and kept for the command's
    summary (`auto_precision_reason`; `vitpose predict` prints it with its summary, once), not on
    stderr, where a command's one-line errors go."""
    global _reason
    _reason = text
    if text not in _said:
        _said.add(text)
        log.info(text)


_reason: str | None = None


def auto_precision_reason() -> str | None:
    """Why `auto` chose what it chose on a CPU with native bf16 (the measured figure), or None
    where it has not decided on one in this process."""
    return _reason


def _clearly_faster(figure: dict) -> bool:
    """bf16's median speed-up at least BF16_MIN_SPEEDUP, and faster than fp32 in all rounds but one:
    on a loaded machine a median alone can come from a few lucky rounds (measured here, 2 threads,
    load ~11: rounds 2.07, 1.55, 1.33, 0.65, 1.59 while 8 longer rounds said 0.92x), and fp32, the
    reference arithmetic, is the choice when in doubt."""
    rounds = sorted(figure.get("rounds") or [])
    return figure["speedup"] >= BF16_MIN_SPEEDUP and (len(rounds) < 2 or rounds[1] > 1.0)


def _auto_on_cpu(step, step_name) -> str:
    """`auto` on a CPU: bf16 where it is gated, native and measured faster; else fp32 (the reason said once)."""
    if "bf16" not in AUTO_PRECISIONS.get("cpu", ()):
        return "fp32"
    if not cpu_has_native_bf16():  # AVX2 and the like: emulated bf16 is never auto's choice, and never timed
        return "fp32"
    figure = cpu_bf16_speedup(step, step_name)
    faster = _clearly_faster(figure)
    rounds = f", rounds {figure['rounds']}, load {figure['load']}" if figure["rounds"] else ""
    _say_once(f"precision auto: {'bf16' if faster else 'fp32'} on this CPU ({cpu_model_name()}): bf16 runs "
              f"{figure['speedup']:.2f}x fp32's speed here ({figure['source']}{rounds}); bf16 is taken from "
              f"{BF16_MIN_SPEEDUP}x up, faster in all rounds but one")
    return "bf16" if faster else "fp32"


def _runs_natively(precision: str, device: torch.device) -> bool:
    if device.type == "cpu":
        return precision == "bf16" and cpu_has_native_bf16()
    if device.type == "cuda":  # fp16 tensor cores since Volta; bf16 since Ampere (compute capability 8)
        return precision == "fp16" or torch.cuda.get_device_capability(device)[0] >= 8
    return False


@functools.cache
def _say_bf16_is_emulated() -> None:
    """Once per process: a command resolves its precision both when checking flags and when loading."""
    log.warning("precision bf16: this CPU has no native bf16 (AVX512-BF16 or AMX, or ONEDNN_MAX_CPU_ISA / "
                "ATEN_CPU_CAPABILITY hide it), so bf16 is emulated, several times slower than fp32; "
                "use auto or fp32")


def resolve_precision(precision: str, device, step=None, step_name: str | None = None) -> torch.dtype | None:
    """`"auto" | "fp32" | "bf16" | "fp16"` on `device` -> the autocast dtype, or None for fp32.

    auto: the first of `AUTO_PRECISIONS[device type]` the device computes natively: fp16 on CUDA;
    on a CPU bf16 where it is native (AVX512-BF16 or AMX) and measured faster than fp32 by
    `BF16_MIN_SPEEDUP` (`cpu_bf16_speedup(step, step_name)`: `step()` one forward of the model,
    None a ViT-S stand-in; cached), fp32 everywhere else (each passed the accuracy gate; see
    AUTO_PRECISIONS). The reason for a CPU's choice is printed once, on stderr.
    An explicit choice is taken as asked where torch can run it (bf16 on an older CPU is emulated:
    correct but slower, and a warning says so); one it cannot run raises ValueError in one line
    naming the fix.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    device = torch.device(device)
    if precision == "auto":
        if device.type == "cpu":
            return _AUTOCAST_DTYPES[_auto_on_cpu(step, step_name)]
        chosen = next((p for p in AUTO_PRECISIONS.get(device.type, ()) if _runs_natively(p, device)), "fp32")
        return _AUTOCAST_DTYPES[chosen]
    dtype = _AUTOCAST_DTYPES[precision]
    if dtype is None:
        return None
    if device.type == "cpu" and dtype is torch.bfloat16 and not _runs_natively("bf16", device):
        _say_bf16_is_emulated()  # taken as asked, but said: emulated bf16 ran ViTPose 9x slower on AVX2
    if device.type == "cuda" and dtype is torch.bfloat16 and not _runs_natively("bf16", device):
        raise ValueError(f"precision bf16 needs a GPU of compute capability 8.0 or newer (Ampere), this one is "
                         f"{torch.cuda.get_device_capability(device)}; use fp16, fp32 or auto")
    if not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"precision {precision} needs autocast, which torch does not offer on {device.type}; "
                         f"use fp32 or auto")
    return dtype


def precision_name(dtype: torch.dtype | None) -> str:
    """torch.bfloat16 -> "bf16", torch.float16 -> "fp16", None -> "fp32" (for logs and reports)."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


# ----------------------------------------------------------------------------------------------
# The C allocator of CPU runs.

# Freed memory glibc keeps at the top of the heap before it gives it back to the system: above the
# memory a forward pass frees at once (ViTPose-S: ~0.9 GB peak RSS at 16 crops, ~1.5 GB at 64), so a
# steady job keeps its pages instead of returning and re-faulting them each pass.
KEEP_FREED_BYTES = 1 << 30
# The setting, per glibc environment variable (read at start-up) with its mallopt(3) parameter
# number (glibc's malloc.h): a trim threshold, and no mmap for malloc. The trim threshold first:
# setting it also stops glibc from moving its thresholds by itself.
_KEEP_PAGES = {"MALLOC_TRIM_THRESHOLD_": (-1, KEEP_FREED_BYTES), "MALLOC_MMAP_MAX_": (-4, 0)}
_ALLOCATOR_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_allocator_tuned = False


def allocator_environment() -> dict[str, str]:
    """`tune_cpu_allocator`'s setting as glibc's environment variables, for a process started
    with them (benchmarks give it to processes they cannot call into, such as a peer's venv)."""
    return {name: str(value) for name, (_, value) in _KEEP_PAGES.items()}


def tune_cpu_allocator(device="cpu") -> bool:
    """On a CPU: make glibc's malloc keep the memory a forward pass frees for the next one; True when done.

    Why: torch allocates every activation of an eager CPU forward afresh. glibc serves the big
    ones (MBs) with mmap, or trims them off the heap once freed, so the next pass page-faults all
    of it back in: 135k minor faults and 0.4 s of system time per ViTPose-S pass at 16 crops, 750k
    at 64; tuned, none, and the pass takes 0.83x / 0.77x the time (benchmarks/bench_allocator.py;
    BENCHMARKS.md "CPU allocator"; end to end less: 1.04-1.06x on AMX, none seen under the AVX2
    emulation). The cost: the process keeps its peak memory (1.5 GB against 1.2 GB peak RSS at 64
    crops). Intel's tuning guide for PyTorch on CPUs gives the same advice with jemalloc/tcmalloc;
    this needs no preloaded library.

    Process-wide, so the command lines call it with their device (`vitpose predict`, evaluate.py)
    and the Python API leaves it to the caller. Does nothing (False) for another device than the
    CPU, off glibc, under a preloaded allocator (LD_PRELOAD), or when the user set glibc's own
    variables (MALLOC_*_, GLIBC_TUNABLES malloc tunables): their choice stands.
    """
    import ctypes
    import os
    import platform
    import sys

    global _allocator_tuned
    if torch.device(device).type != "cpu":  # "cpu", "cpu:0", torch.device("cpu") alike
        return False
    if _allocator_tuned:
        return True
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in _ALLOCATOR_VARIABLES) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    if any(name in os.environ.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc")):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    _allocator_tuned = all(libc.mallopt(parameter, value) == 1 for parameter, value in _KEEP_PAGES.values())
    return _allocator_tuned
