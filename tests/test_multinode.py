"""Training beyond one node (issue 29 item 5), end to end with real processes (slow tier).

- srun without torchrun: two processes given only SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (and
  the rendezvous address) form one gloo group of world size 2 and train (the mapping itself is
  checked in tests/test_shard.py::test_shard_and_rank_from_launcher_variables).
- `torchrun --max-restarts 3 ... --resume auto`: a worker killed after the first epoch's save makes
  torchrun restart both, and they continue from that checkpoint instead of starting over, on the
  first restart. (torchrun's static rendezvous keeps one store across restarts; before each attempt's
  keys got their own prefix, the restarted pair read the dead workers' addresses: gloo's
  "connectFullMesh ... Connection refused" on every restart, or a hang.)
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_args(tmp_path, epochs):
    return ["--demo", "--epochs", str(epochs), "--work-dir", str(tmp_path / "run"),
            "--set", f"data.root={tmp_path / 'synthetic'}", "--set", "data.synthetic_train_images=8",
            "--set", "data.synthetic_val_images=2", "--set", "loader.num_workers=0", "--set", "loader.batch_size=2"]


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                      "MASTER_", "TORCHELASTIC"))}
    return {**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow  # two processes import torch and train a few steps: about a minute
def test_srun_variables_alone_make_a_two_process_group(tmp_path):
    # The synthetic set first, by one process, so that the two ranks do not race to write it.
    first = subprocess.run([sys.executable, str(REPO / "train.py"), *demo_args(tmp_path, 1),
                            "--set", "train.stop_at_iteration=1", "--work-dir", str(tmp_path / "prepare")],
                           cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    port = free_port()
    ranks = []
    for rank in range(2):
        env = {**clean_env(), "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
               "SLURM_JOB_ID": "4242", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        ranks.append(subprocess.Popen([sys.executable, str(REPO / "train.py"), *demo_args(tmp_path, 1),
                                       "--set", "train.stop_at_iteration=2"],
                                      cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = [p.communicate(timeout=600)[0] for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "2 process(es)" in outputs[0], outputs[0][-3000:]  # rank 0 reports the world it joined
    assert "stopped by train.stop_at_iteration" in outputs[0]


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.slow  # torchrun, two workers, six tiny epochs and a restart: about a minute on 2 CPUs
def test_torchrun_max_restarts_resumes_through_resume_auto(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "3",
           "--master-port", str(free_port()), str(REPO / "train.py"),
           *demo_args(tmp_path, 6), "--resume", "auto"]
    log = open(tmp_path / "torchrun.log", "w")
    run = subprocess.Popen(cmd, cwd=tmp_path, env=clean_env(), stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    last = tmp_path / "run" / "last.pth"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and run.poll() is None and not last.exists():
            time.sleep(0.2)
        # The save is atomic (a rename): what exists is whole. Kill at once: 6 epochs leave time to
        # find the workers before the run could end by itself.
        saved_epoch = torch.load(last, map_location="cpu", weights_only=False)["epoch"]
        workers = children_of(run.pid)
        assert run.poll() is None and len(workers) == 2, ("the run ended before the kill", workers)
        os.kill(max(workers), signal.SIGKILL)  # one worker dies as a lost node's would
        assert run.wait(timeout=600) == 0, (tmp_path / "torchrun.log").read_text()[-4000:]
    finally:
        if run.poll() is None:  # nothing of a hung run may outlive the test
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        log.close()
    output = (tmp_path / "torchrun.log").read_text()
    assert "resumed from" in output and f"{last}" in output, output[-4000:]
    assert output.count("resumed from") == 1 and "Connection refused" not in output, output[-4000:]  # one restart
    resumed = [line for line in output.splitlines() if "resumed from" in line][0]
    assert int(resumed.split("epoch ")[1].split(",")[0]) >= saved_epoch
    final = torch.load(last, map_location="cpu", weights_only=False)
    assert final["epoch"] == 6, final["epoch"]
