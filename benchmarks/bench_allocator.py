"""The CPU allocator: a ViTPose forward pass with glibc's malloc as it comes vs as the commands tune it.

    python benchmarks/bench_allocator.py [--model vitpose-s] [--sizes 16 64] [--rounds 7] [--threads 2]

Why: torch allocates each activation of an eager CPU forward afresh, and glibc's malloc hands
big blocks back to the system when they are freed (mmap, heap trimming), so every pass faults
its pages in again. `vitpose.device.tune_cpu_allocator()` (called by `vitpose predict` and
evaluate.py on a CPU) keeps them. This measures what that buys and costs.

Protocol (benchmarks/rounds.py): two worker processes, one with glibc's defaults and one that
called `tune_cpu_allocator()` (the setting is process-wide and cannot be undone, hence two
processes), each with the same random-weight model and inputs and `--threads` torch threads;
they never run at the same time. Per forward batch in `--sizes`: both warm up until three
passes agree within 10%, then `--rounds` rounds of one pass each, the order reversed every other
round. Printed per size: ms per crop (median [min-max] over rounds), minor page faults and
system CPU seconds per pass (getrusage, median), the tuned / default time ratio taken round by
round, and each worker's peak RSS at the end.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rounds import alternate, load_note, ratios, spread, warm_up  # noqa: E402

MODES = ("default", "tuned")


def worker(mode: str, model_name: str, threads: int) -> None:
    """Answer one JSON command per stdin line: {"crops": n} -> one timed forward pass."""
    import time

    import torch

    from vitpose.device import tune_cpu_allocator
    from vitpose.models.vitpose import build_model

    if mode == "tuned" and not tune_cpu_allocator():
        raise SystemExit("tune_cpu_allocator() did nothing here (not glibc, or MALLOC_* / LD_PRELOAD set)")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(model_name).eval()
    inputs = torch.randn(128, 3, 256, 192)
    print("READY", flush=True)
    with torch.inference_mode():
        for line in sys.stdin:
            command = json.loads(line)
            if "crops" not in command:
                break
            x = inputs[: command["crops"]].contiguous()
            before = resource.getrusage(resource.RUSAGE_SELF)
            start = time.perf_counter()
            model(x)
            seconds = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
            print("DONE " + json.dumps(dict(seconds=seconds, faults=after.ru_minflt - before.ru_minflt,
                                            system=after.ru_stime - before.ru_stime,
                                            peak_rss_mb=after.ru_maxrss / 1024)), flush=True)


class Worker:
    def __init__(self, mode, args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env["OMP_NUM_THREADS"] = str(args.threads)
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", mode, "--model", args.model,
                                      "--threads", str(args.threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        if self.proc.stdout.readline().strip() != "READY":
            raise SystemExit(f"{mode} worker failed to start (exit {self.proc.wait()})")
        self.last = {}

    def run(self, crops):
        self.proc.stdin.write(json.dumps({"crops": crops}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line.startswith("DONE "):
            raise SystemExit(f"worker died (exit {self.proc.wait()})")
        self.last = json.loads(line[5:])
        return self.last

    def close(self):
        self.proc.stdin.write("{}\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vitpose-s")
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 64],
                   help="crops per forward pass (16 = the CPU default of 8 boxes with the flip test)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.model, args.threads)
    if max(args.sizes) > 128 or min(args.sizes) < 1:
        raise SystemExit("--sizes: 1 to 128 crops per pass")
    print(f"{args.model} fp32, 256x192 crops, {args.threads} torch threads, two worker processes "
          f"(glibc malloc default / tune_cpu_allocator), {args.rounds} alternating rounds; {load_note()}")
    workers = {mode: Worker(mode, args) for mode in MODES}
    try:
        for crops in args.sizes:
            stats = {mode: [] for mode in MODES}

            def pass_of(mode):
                answer = workers[mode].run(crops)
                stats[mode].append(answer)
                return answer["seconds"]

            contestants = {mode: (lambda mode=mode: pass_of(mode)) for mode in MODES}
            warmed = {mode: warm_up(run, max_steps=10) for mode, run in contestants.items()}
            for mode in MODES:
                stats[mode].clear()
            times = alternate(contestants, args.rounds)
            print(f"\n{crops} crops per pass (warm-up passes: " + ", ".join(f"{m} {n}" for m, n in warmed.items()) + ")")
            for mode in MODES:
                ms = [t / crops * 1000 for t in times[mode]]
                print(f"  {mode:8s} {spread(ms)} ms/crop, {statistics.median(s['faults'] for s in stats[mode]):,.0f} "
                      f"minor faults and {statistics.median(s['system'] for s in stats[mode]):.3f} s system time per pass")
            print(f"  tuned / default time per round: {spread(ratios(times, 'tuned', 'default'))}")
        print("\npeak RSS: " + ", ".join(f"{mode} {w.last.get('peak_rss_mb', 0):.0f} MB" for mode, w in workers.items()))
    finally:
        for w in workers.values():
            w.close()
    print(f"after: {load_note()}")


if __name__ == "__main__":
    main()
