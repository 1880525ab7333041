"""`vitpose serve` under load: requests/s and latency at 1, 4 and 16 clients against offline batched
`vitpose predict` on the same images, and the server's memory after 1,000 requests vs after 100.

    python benchmarks/bench_serve.py [--model vitpose-s|tiny] [--images 32] [--requests 48] [--rounds 3]
                                     [--max-batch 16] [--threads 1] [--precision fp32] [--memory-requests 100 1000]

Protocol (benchmarks/rounds.py): a random-weight model (speed only) saved with its spec, synthetic
one-person images (the full-frame detector: one crop per image, so people/s = images/s). The
server runs as its own process (`python -m vitpose serve`, loopback, a free port) and the clients
are threads of this process on keep-alive connections, each sending raw image bodies one after
the other. Offline is `vitpose predict DIR --json` in this process with `--batch-images` and
`--batch-size` = `--max-batch`, timed by its own stage timer (decode .. write, the model load
left out). Each contestant warms up until steady, then the four alternate for `--rounds` rounds,
the order reversed every other round; each round's people/s ratio (16 clients / offline) is taken
within the round. Latency percentiles are over every request of every round of a contestant.
Memory: the server's RSS after 100 requests (past warm-up) and after 1,000 (16 clients).
Every request has a timeout and every stretch a bounded count, so the run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import psutil
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from rounds import alternate, load_note, spread, warm_up  # noqa: E402

import vitpose  # noqa: E402
from vitpose.cli import main as vitpose_main  # noqa: E402

REQUEST_TIMEOUT_S = 120
TINY = {"depth": 1, "embed_dim": 96, "num_heads": 3, "deconv_channels": (32, 32)}


def write_images(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        h, w = int(rng.integers(240, 480)), int(rng.integers(180, 360))
        yy, xx = np.mgrid[0:h, 0:w]
        image = np.stack([(xx + 3 * i) % 256, (yy + 5 * i) % 256, (xx + yy) % 256], -1).astype(np.uint8)
        cv2.circle(image, (w // 2, h // 5), max(8, w // 10), (60, 60, 200), -1)
        cv2.line(image, (w // 2, h // 5), (w // 2, 3 * h // 5), (30, 30, 30), max(3, w // 30))
        path = folder / f"{i:012d}.jpg"
        cv2.imwrite(str(path), image)
        paths.append(path)
    return paths


def start_server(weights: Path, args, cwd: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.Popen([sys.executable, "-m", "vitpose", "serve", "--model", str(weights), "--detector",
                             "full-frame", "--device", "cpu", "--precision", args.precision, "--max-batch",
                             str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms), "--host", "127.0.0.1",
                             "--port", "0"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 180
    for line in proc.stdout:
        if line.startswith("vitpose serve: http://127.0.0.1:"):
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, int(line.split("http://127.0.0.1:")[1].split("/")[0])
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


class Clients:
    """`clients` threads on keep-alive connections sending `count` requests in all; latencies kept."""

    def __init__(self, port: int, bodies: list[bytes]):
        self.port, self.bodies = port, bodies
        self.latencies: list[float] = []

    def run(self, clients: int, count: int) -> float:
        lock, next_index, errors = threading.Lock(), [0], []
        latencies = []

        def client():
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
            try:
                while True:
                    with lock:
                        i = next_index[0]
                        next_index[0] += 1
                    if i >= count:
                        return
                    start = time.perf_counter()
                    connection.request("POST", f"/v1/predict?file_name={i % len(self.bodies):012d}.jpg",
                                       body=self.bodies[i % len(self.bodies)])
                    response = connection.getresponse()
                    data = response.read()
                    if response.status != 200:
                        errors.append(f"{response.status} {data[:200]!r}")
                        return
                    with lock:
                        latencies.append(time.perf_counter() - start)
            except OSError as e:
                errors.append(repr(e))
            finally:
                connection.close()

        start = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(REQUEST_TIMEOUT_S * count)
        seconds = time.perf_counter() - start
        if errors:
            raise SystemExit(f"requests failed: {errors[:3]}")
        self.latencies += latencies
        return seconds


def offline(folder: Path, weights: Path, args, out: Path, images: int):
    """`vitpose predict DIR --json` in this process -> the seconds its stage timer counted."""
    argv = ["predict", str(folder), "--model", str(weights), "--detector", "full-frame", "--device", "cpu",
            "--precision", args.precision, "--batch-images", str(args.max_batch), "--batch-size",
            str(args.max_batch), "--json", str(out)]

    def run() -> float:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
            assert vitpose_main(argv) == 0
        # "total  SECONDS  100.0%  MS_PER_IMAGE": the milliseconds per image have the finer resolution
        total = re.search(r"^total\s+[0-9.]+\s+[0-9.]+%\s+([0-9.]+)", printed.getvalue(), re.MULTILINE)
        return float(total.group(1)) * images / 1000
    return run


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vitpose-s", help="a model size, or tiny (see below)")
    p.add_argument("--images", type=int, default=32)
    p.add_argument("--requests", type=int, default=48, help="requests per timed stretch of a client count")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-wait-ms", type=float, default=10.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server and of offline predict")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    p.add_argument("--memory-requests", type=int, nargs=2, default=[100, 1000],
                   help="RSS after this many requests and after that many (0 0: skip)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    torch.manual_seed(0)
    weights = work / "model.safetensors"
    # "tiny" (one block of width 96, the tests' model): the network costs little, so the figures show
    # the server's own cost (HTTP, decoding, JSON, batching) at its largest share
    model = vitpose.build_model("vitpose-s", **TINY) if args.model == "tiny" else vitpose.build_model(args.model)
    vitpose.save_weights(model.eval(), weights)
    folder = work / "images"
    paths = write_images(folder, args.images)
    bodies = [path.read_bytes() for path in paths]
    print(f"{args.model} (random weights), {args.images} one-person images, cpu, {args.threads} threads, "
          f"{args.precision}, max batch {args.max_batch}, max wait {args.max_wait_ms:g} ms; {load_note()}", flush=True)

    proc, port = start_server(weights, args, work)
    try:
        clients = Clients(port, bodies)
        contestants = {"offline predict": offline(folder, weights, args, work / "offline.jsonl", args.images)}
        people = {"offline predict": args.images}
        for n in (1, 4, 16):
            contestants[f"{n} clients"] = (lambda n=n: clients.run(n, args.requests))
            people[f"{n} clients"] = args.requests
        warmed = {name: warm_up(step, window=2, tolerance=0.25, max_steps=4) for name, step in contestants.items()}
        print("warm-up stretches: " + ", ".join(f"{k} {v}" for k, v in warmed.items()), flush=True)
        latencies = {}
        for name in contestants:  # the warm-up's latencies are not counted
            if name != "offline predict":
                def measured(name=name, step=contestants[name]):
                    before = len(clients.latencies)
                    seconds = step()
                    latencies.setdefault(name, []).extend(clients.latencies[before:])
                    return seconds
                contestants[name] = measured
        seconds = alternate(contestants, args.rounds, report=lambda line: print(line, flush=True))
        rate = {name: [people[name] / s for s in times] for name, times in seconds.items()}
        print("| contestant | people/s (= requests/s) | p50 ms | p99 ms | people/s vs offline (per round) |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name, values in rate.items():
            ratio = [a / b for a, b in zip(values, rate["offline predict"])]
            lat = sorted(latencies.get(name, []))
            p50 = f"{1e3 * statistics.median(lat):.0f}" if lat else "-"
            p99 = f"{1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]:.0f}" if lat else "-"
            print(f"| {name} | {spread(values)} | {p50} | {p99} | {spread(ratio)} |", flush=True)

        process = psutil.Process(proc.pid)
        first, last = args.memory_requests
        if not last:
            return
        clients.run(16, first)
        rss_first = process.memory_info().rss
        clients.run(16, last - first)
        rss_last = process.memory_info().rss
        print(f"server RSS after {first} more requests {rss_first / 2**20:.0f} MiB, after {last} "
              f"{rss_last / 2**20:.0f} MiB: {100 * (rss_last / rss_first - 1):+.1f} % (the warm-up and rounds came first)")
        print(f"after: {load_note()}")
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
