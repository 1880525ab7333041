"""Running the application with uvicorn: the address it listens on, and a clean stop.

`listen(host, port)` binds the socket first (before the model loads: a taken port is one line at
once), `run(app, sock, on_listening)` serves on it until SIGTERM or SIGINT. uvicorn then stops accepting
connections, lets the requests in flight finish (up to `grace` seconds), runs the application's
shutdown (the batch thread finishes its jobs) and returns; SIGTERM returns 0 (a stop that was
asked for), SIGINT raises KeyboardInterrupt (the command's 130). `on_listening(host, port)` is
called with the port the socket got (`--port 0` picks a free one: tests and benchmarks read it).
"""

from __future__ import annotations

import signal
import socket

import uvicorn

from vitpose.errors import UserError

__all__ = ["run"]


class _Server(uvicorn.Server):
    def __init__(self, config, on_listening):
        super().__init__(config)
        self.on_listening = on_listening

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.servers:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self.on_listening(host, port)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (bound here, so a taken port is one line naming it)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as e:
        raise UserError(f"--host {host}: not an address of this machine ({e})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart right after a stop binds again
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e}); pick another "
                        f"--port (0: a free one) or --host") from None
    return sock


def run(app, sock: socket.socket, on_listening, grace: float = 120.0) -> int:
    """Serve `app` on the listening socket (`listen`) until a signal; 0 after SIGTERM."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=grace, server_header=False)
    server = _Server(config, on_listening)
    stopped = []
    # uvicorn re-raises the signal it stopped on with the handler it found: for SIGTERM that is this
    # one, so the process exits 0 after the requests in flight were answered, instead of dying by it
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    return 0
