"""Real HTTP reward services on 127.0.0.1 for the remote-reward tests: each answers by a script of its own."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the service does with one request: wait ``delay_s``, then answer ``status`` with ``body`` (JSON unless
    bytes); ``trickle_s`` sends the body one byte at a time, that long apart."""

    status: int = 200
    body: Any = None
    delay_s: float = 0.0
    trickle_s: float = 0.0


def length_scores(request: dict[str, Any]) -> Reply:
    """Each response's length as its score, twice that as the named score ``double``."""
    lengths = [float(len(text)) for text in request["responses"]]
    return Reply(200, {"scores": lengths, "extra": {"double": [2 * value for value in lengths]}})


@dataclass
class Service:
    """A running service: its URL, the requests it received (body and headers) and the most in flight at once."""

    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    max_in_flight: int = 0
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)


@contextlib.contextmanager
def reward_service(script: Callable[[int, dict[str, Any]], Reply]) -> Iterator[Service]:
    """A threaded HTTP server on a free 127.0.0.1 port answering ``POST`` request number n (0, 1, ...) with
    ``script(n, request)``; stopped on exit."""
    service = Service(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with service._lock:
                number = len(service.requests)
                service.requests.append(request)
                service.headers.append(dict(self.headers))
                service._in_flight += 1
                service.max_in_flight = max(service.max_in_flight, service._in_flight)
            answering = False
            try:
                reply = script(number, request)
                time.sleep(reply.delay_s)
                # no longer in flight once the answer starts: a client that has read it may send its next request
                # before this thread runs again, and must not be counted twice
                with service._lock:
                    service._in_flight -= 1
                answering = True
                data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if reply.trickle_s:
                    for byte in data:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(reply.trickle_s)
                else:
                    self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on this request (its timeout): expected
            finally:
                if not answering:
                    with service._lock:
                        service._in_flight -= 1

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    service.url = f"http://127.0.0.1:{server.server_address[1]}/score"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def refused_url() -> str:
    """The URL of a port on 127.0.0.1 that nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/score"
