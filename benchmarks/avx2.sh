#!/usr/bin/env bash
# Run a command as on an AVX2 CPU without AVX-512 or VNNI (an AVX2 EPYC, a pre-Ice-Lake Xeon):
#   bash benchmarks/avx2.sh python benchmarks/bench_predict.py --speed-peers ...
# torch, oneDNN and MKL take their caps from variables; ONNX Runtime, numpy and OpenVINO read
# CPUID, so cpuid_avx2.c (built here once, with the system's C compiler) masks the AVX-512,
# AVX-VNNI and AMX bits CPUID reports to this command and every process it starts.
# Needs Linux on x86-64 with CPUID faulting (the cpuid_fault flag in /proc/cpuinfo).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vitpose-bench"
library="$cache/cpuid_avx2.so"
if [ "$#" -eq 0 ]; then
    echo "usage: bash benchmarks/avx2.sh COMMAND [ARGS...]" >&2
    exit 2
fi
if ! grep -qw cpuid_fault /proc/cpuinfo 2>/dev/null; then
    echo "avx2.sh: this CPU or kernel has no CPUID faulting (no cpuid_fault in /proc/cpuinfo): cannot hide AVX-512 here" >&2
    exit 2
fi
if [ ! -f "$library" ] || [ "$here/cpuid_avx2.c" -nt "$library" ]; then
    mkdir -p "$cache"
    cc -O2 -shared -fPIC -o "$library.tmp.$$" "$here/cpuid_avx2.c"
    mv "$library.tmp.$$" "$library"
fi
export LD_PRELOAD="$library${LD_PRELOAD:+:$LD_PRELOAD}"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
exec "$@"
