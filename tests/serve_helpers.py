"""`vitpose serve` as a subprocess for the tests: start it on 127.0.0.1 with a free port, talk HTTP.

Every wait is bounded: the server must say its address within `STARTUP_S`, each request has a
socket timeout, and `stop` kills what did not exit. http.client talks to the server directly (no
proxy from the environment can come between).
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from conftest import REPO

STARTUP_S = 120  # loading torch and the model on a loaded 2-core CI machine


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, lines: queue.Queue):
        self.proc, self.port, self.lines = proc, port, lines

    def request(self, method: str, path: str, body: bytes | None = None, headers=None, timeout: float = 60):
        """(status, headers, body bytes) of one request on its own connection."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def json(self, method: str, path: str, body=None, headers=None, timeout: float = 60):
        status, _, data = self.request(method, path, body, headers, timeout)
        return status, json.loads(data)

    def metric(self, name: str, headers=None) -> float:
        status, _, text = self.request("GET", "/metrics", headers=headers)
        assert status == 200, text
        for line in text.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"/metrics has no {name}")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


def start_server(args, cwd: Path) -> Server:
    """`python -m vitpose serve ARGS --host 127.0.0.1 --port 0`, once it listens (its port read from stdout)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen([sys.executable, "-m", "vitpose", "serve", *map(str, args), "--host", "127.0.0.1",
                             "--port", "0"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen = []
    while True:
        try:
            line = lines.get(timeout=STARTUP_S)
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"vitpose serve did not listen within {STARTUP_S} s: {''.join(seen)}") from None
        if line is None:
            raise AssertionError(f"vitpose serve exited ({proc.wait()}) before listening: {''.join(seen)}")
        seen.append(line)
        if line.startswith("vitpose serve: http://127.0.0.1:"):
            port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
            return Server(proc, port, lines)


def multipart(fields: dict) -> tuple[bytes, dict]:
    """(body, headers) of a multipart/form-data request; a field's value is text or (file name, bytes)."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        if isinstance(value, tuple):
            filename, data = value
            head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                    f"Content-Type: application/octet-stream\r\n\r\n").encode()
        else:
            head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
            data = str(value).encode()
        parts.append(head + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def venv_of_its_own(name: str, requirements: list[str], ready: Path | None = None, no_deps: list[str] = (),
                    hint: str = "") -> Path:
    """A virtual environment of its own under ~/.cache/vitpose-tests/NAME for a third-party tool or
    reader a slow test drives (never installed into the project's environment), with `requirements`
    pip-installed once (then `no_deps` with --no-deps: a package whose own requirements are far more
    than the part a test reads). `ready`: the file that says it is installed (default a marker
    written after pip succeeds). Skipped with the reason where pip cannot reach the package index."""
    import pytest

    venv = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vitpose-tests" / name
    marker = venv / ".vitpose-tests-installed"
    if not (ready or marker).exists():
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
            subprocess.run([*pip, *requirements], check=True, capture_output=True, timeout=1800)
            if no_deps:
                subprocess.run([*pip, "--no-deps", *no_deps], check=True, capture_output=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            pytest.skip(f"{name} could not be installed into {venv} ({type(e).__name__}); install it there "
                        f"(pip install {' '.join([*requirements, *no_deps])}){hint}")
        marker.touch()
    return venv


def tool_in_its_own_venv(variable: str, command: str, requirements: list[str], venv_name: str | None = None) -> str:
    """The command of a third-party tool a slow test drives (Label Studio, schemathesis), never installed
    into the project's environment: `$variable` when set, else the command on PATH, else installed
    once with pip into its own virtual environment under ~/.cache/vitpose-tests/ (`venv_of_its_own`;
    the slow tier only; skipped with the reason where pip cannot reach the package index). `venv_name`:
    a library rather than a tool (aniposelib): its environment's folder, whose `command` (its python) is
    never looked up on PATH."""
    import shutil

    given = os.environ.get(variable) or (shutil.which(command) if venv_name is None else None)
    if given:
        return given
    name = venv_name or command
    venv = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vitpose-tests" / name
    venv_of_its_own(name, requirements, ready=venv / "bin" / command,
                    hint=f" or set {variable}=/path/to/{command}")
    return str(venv / "bin" / command)
