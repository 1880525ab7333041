"""benchmarks/avx2.sh: a command sees an AVX2 CPU (CPUID without AVX-512/VNNI), and its own faults
still behave as without it. Runs only where there is something to hide and the kernel can trap CPUID."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cpuinfo_flags() -> set:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = _cpuinfo_flags()
pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64" or shutil.which("cc") is None
    or not {"cpuid_fault", "avx512f"} <= FLAGS,
    reason="needs Linux x86-64 with CPUID faulting, an AVX-512 CPU and a C compiler")

SEEN = """
import json, numpy, torch
from numpy._core._multiarray_umath import __cpu_features__ as f
print(json.dumps({"AVX512F": f["AVX512F"], "AVX512VNNI": f.get("AVX512VNNI", f.get("AVX512_CLX")),
                  "AVX2": f["AVX2"], "FMA3": f["FMA3"], "aten": torch.backends.cpu.get_cpu_capability()}))
"""


def _plain_env() -> dict:
    # without a preload this suite may itself run under (bash benchmarks/avx2.sh pytest)
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def _run(tmp_path, code: str):
    env = dict(_plain_env(), XDG_CACHE_HOME=str(tmp_path / "cache"))
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "avx2.sh"), sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_command_sees_avx2_without_avx512(tmp_path):
    import json

    plain = subprocess.run([sys.executable, "-c", SEEN], env=_plain_env(), capture_output=True, text=True,
                           timeout=120)
    assert json.loads(plain.stdout)["AVX512F"] is True  # the CPU has it: there is something to hide
    done = _run(tmp_path, SEEN)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"AVX512F": False, "AVX512VNNI": False, "AVX2": True, "FMA3": True, "aten": "AVX2"}
    assert (tmp_path / "cache" / "vitpose-bench" / "cpuid_avx2.so").is_file()  # built once, in the cache


def test_a_real_fault_still_crashes_and_faulthandler_still_reports_it(tmp_path):
    crash = "import faulthandler, ctypes; faulthandler.enable(); import numpy; ctypes.string_at(0)"
    done = _run(tmp_path, crash)
    assert done.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV)
    assert "Fatal Python error: Segmentation fault" in done.stderr
    sent = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV); print('survived')"
    done = _run(tmp_path, sent)
    assert done.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV) and "survived" not in done.stdout


def test_a_program_handler_for_segv_is_kept(tmp_path):
    # The program's own SIGSEGV handler sees its signals; the CPUIDs never reach it.
    code = ("import signal, os, numpy\n"
            "hits = []\n"
            "signal.signal(signal.SIGSEGV, lambda s, f: hits.append(s))\n"
            "import onnxruntime\n"
            "os.kill(os.getpid(), signal.SIGSEGV)\n"
            "print(len(hits), signal.getsignal(signal.SIGSEGV) is not signal.SIG_DFL)\n")
    done = _run(tmp_path, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "True"]


def test_a_real_fault_ends_the_program_even_when_it_ignores_segv(tmp_path):
    # as without the library: the kernel does not let a program ignore its own faults
    code = "import signal, ctypes\nsignal.signal(signal.SIGSEGV, signal.SIG_IGN)\nctypes.string_at(0)\n"
    done = _run(tmp_path, code)
    assert done.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV)
    ignored = "import os, signal\nsignal.signal(signal.SIGSEGV, signal.SIG_IGN)\nos.kill(os.getpid(), signal.SIGSEGV)\nprint('ok')\n"
    done = _run(tmp_path, ignored)
    assert done.returncode == 0 and done.stdout.split() == ["ok"]
