"""Training launchers: the rendezvous wait and the launcher's variables (CI tier).

- a rank whose peers never come waits with a printed timeout, stops at the timeout or on a stop
  request within a second, with one line naming the ranks missing (or rank 0's address);
- `vitpose train` as rank 0 of 2 with no peer, SIGTERM after its waiting line: exit 143 within
  seconds, one line naming rank 1 and the address;
- SLURM / torchrun variable mistakes are one line naming the variable, exit 2, in training as in
  predict; srun's launch node is the rendezvous address when MASTER_ADDR is not set;
- a stop that came from another rank (no signal here) exits 143.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO

from vitpose.cli import main
from vitpose.engine import rendezvous
from vitpose.engine.distributed import _slurm_rendezvous, launch_environment
from vitpose.engine.rendezvous import LaunchError, RendezvousError, join, rendezvous_timeout
from vitpose.errors import UserError, signal_exit_status
from vitpose.run.stop import StopOnSignal


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def address(port):
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def test_rank_0_without_its_peer_gives_up_at_the_timeout_naming_the_missing_rank(capsys):
    port = free_port()
    started = time.monotonic()
    with pytest.raises(RendezvousError) as caught:
        join(0, 3, timeout=1.0, environ=address(port))
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "ranks 1, 2 of 3" in message and f"127.0.0.1:{port}" in message and "1 s" in message
    assert caught.value.exit_status == 2
    said = capsys.readouterr().err
    assert "rank 0 of 3: waiting for the other ranks" in said and "rendezvous timeout 1 s" in said


@pytest.mark.parametrize("rank", [0, 1])
def test_a_stop_request_ends_the_wait_within_a_second(rank):
    stop = StopOnSignal()
    stop.signal_name = "SIGTERM"
    timer = threading.Timer(1.0, stop.event.set)
    timer.start()
    port = free_port()
    started = time.monotonic()
    try:
        with pytest.raises(RendezvousError) as caught:
            join(rank, 2, timeout=60.0, stop=stop, environ=address(port))
    finally:
        timer.cancel()
    assert time.monotonic() - started < 5
    assert caught.value.exit_status == 143 and "stopped by SIGTERM" in str(caught.value)
    waited_for = "rank 1 of 2" if rank == 0 else "rank 0's rendezvous"
    assert waited_for in str(caught.value) and f"127.0.0.1:{port}" in str(caught.value)


def test_two_ranks_meet_and_the_timeout_comes_from_config_or_environment():
    port = free_port()
    stores = {}
    peer = threading.Thread(target=lambda: stores.update(peer=join(1, 2, 30.0, environ=address(port))))
    peer.start()
    stores["main"] = join(0, 2, 30.0, environ=address(port))
    peer.join(timeout=30)
    assert not peer.is_alive() and stores["main"].add(rendezvous.ARRIVALS, 0) == 2
    assert rendezvous_timeout(None, {}) == 600.0
    assert rendezvous_timeout(None, {"VITPOSE_RENDEZVOUS_TIMEOUT": "45"}) == 45.0
    assert rendezvous_timeout(20, {"VITPOSE_RENDEZVOUS_TIMEOUT": "45"}) == 20.0
    with pytest.raises(LaunchError, match="VITPOSE_RENDEZVOUS_TIMEOUT='soon'"):
        rendezvous_timeout(None, {"VITPOSE_RENDEZVOUS_TIMEOUT": "soon"})
    with pytest.raises(LaunchError, match="MASTER_PORT"):
        join(1, 2, 1.0, environ={"MASTER_ADDR": "127.0.0.1"})


@pytest.mark.parametrize("variables, named", [
    ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, "SLURM_PROCID='x' is not a whole number"),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "2"}, "SLURM_PROCID=3 is not below SLURM_NTASKS=2"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "abc"}, "SLURM_NTASKS='abc'"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 is not below WORLD_SIZE=2"),
])
def test_launcher_variable_mistakes_are_one_line_naming_the_variable(variables, named, tmp_path, capsys, monkeypatch):
    with pytest.raises(UserError, match=named.replace("(", r"\(")):
        launch_environment(variables)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    code = main(["train", "--demo", "--work-dir", str(tmp_path / "run"), "--device", "cpu"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err and named in lines[-1] and "error:" in lines[-1], err


def test_srun_launch_node_is_the_rendezvous_and_a_stop_from_another_rank_exits_143():
    environ = {"SLURM_LAUNCH_NODE_IPADDR": "10.1.2.3", "SLURM_JOB_ID": "4711"}
    _slurm_rendezvous(environ)
    assert environ["MASTER_ADDR"] == "10.1.2.3" and environ["MASTER_PORT"] == str(29500 + 711)
    environ = {"MASTER_ADDR": "node7", "SLURM_LAUNCH_NODE_IPADDR": "10.1.2.3"}
    _slurm_rendezvous(environ)
    assert environ["MASTER_ADDR"] == "node7" and environ["MASTER_PORT"] == "29500"
    assert signal_exit_status(None) == 143 and signal_exit_status("SIGTERM") == 143
    assert signal_exit_status("SIGINT") == 130


def test_a_train_rank_without_its_peer_stops_on_sigterm_within_seconds(tmp_path):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", RANK="0", WORLD_SIZE="2", LOCAL_RANK="0",
               **address(port))
    for name in ("SLURM_PROCID", "SLURM_NTASKS", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(name, None)
    child = subprocess.Popen([sys.executable, "-m", "vitpose", "train", "--demo", "--work-dir", str(tmp_path / "run"),
                              "--device", "cpu"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        first = child.stderr.readline()  # the waiting line: the handlers are in place by then
        assert "rank 0 of 2: waiting for the other ranks" in first and "rendezvous timeout 600 s" in first, first
        time.sleep(1.0)
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        rest = child.stderr.read()
        code = child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert time.monotonic() - sent < 10
    lines = [line for line in rest.splitlines() if line.strip()]
    assert code == 143 and len(lines) == 1 and "Traceback" not in rest, rest
    assert "stopped by SIGTERM while waiting for rank 1 of 2" in lines[0] and f"127.0.0.1:{port}" in lines[0]
