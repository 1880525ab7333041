"""Running the application with uvicorn: the address it listens on, and a clean stop.

`run(app, host, port, on_listening)` serves until SIGTERM or SIGINT. uvicorn then stops accepting
connections, lets the requests in flight finish (up to `grace` seconds), runs the application's
shutdown (the batch thread finishes its jobs) and returns; SIGTERM returns 0 (a stop that was
asked for), SIGINT raises KeyboardInterrupt (the command's 130). `on_listening(host, port)` is
called with the port the socket got (`--port 0` picks a free one: tests and benchmarks read it).
"""

from __future__ import annotations

import signal

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


def run(app, host: str, port: int, on_listening, grace: float = 120.0) -> int:
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=grace, server_header=False)
    server = _Server(config, on_listening)
    stopped = []
    # uvicorn re-raises the signal it stopped on with the handler it found: for SIGTERM that is this
    # one, so the process exits 0 after the requests in flight were answered, instead of dying by it
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    try:
        server.run()
    except SystemExit:
        if not server.started:  # uvicorn logged why (the address is taken, not this machine's, ...)
            raise UserError(f"could not listen on {host}:{port} (the line above says why); pick another --port "
                            f"or --host") from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
