"""A small HTTP/1.1 server on asyncio streams, bound to 127.0.0.1: what the endpoint needs, nothing more.

Keep-alive connections, ``Content-Length`` and chunked request bodies, ``Expect: 100-continue``; every response
has a ``Content-Length`` (a stream's events are sent whole, once the generation is done). Bounded: request lines
and headers by the stream's 64 KiB line limit and 100 headers, bodies by ``max_body_bytes`` (HTTP 413), an idle
connection by ``idle_timeout_s``. :meth:`HttpServer.close` closes the socket and every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

__all__ = ["HttpRequest", "HttpResponse", "HttpServer", "NoFreePort"]

HOST = "127.0.0.1"
_MAX_HEADERS = 100


class NoFreePort(OSError):
    """No port of the configured range could be bound on 127.0.0.1."""


@dataclass(frozen=True)
class HttpRequest:
    """One request: method, path (query string removed), headers with lower-case names, body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (ValueError when it is not)."""
        return json.loads(self.body.decode("utf-8"))


@dataclass(frozen=True)
class HttpResponse:
    """One response: status, body, its content type, extra headers."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @classmethod
    def json(cls, status: int, value: Any, headers: tuple[tuple[str, str], ...] = ()) -> "HttpResponse":
        """A JSON response."""
        return cls(int(status), json.dumps(value).encode(), "application/json", headers)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpServer:
    """Serves ``handler`` on one port of 127.0.0.1 (:meth:`start`) until :meth:`close`."""

    def __init__(self, handler: Handler, *, max_body_bytes: int = 64 << 20, idle_timeout_s: float = 600.0) -> None:
        self.handler = handler
        self.max_body_bytes, self.idle_timeout_s = int(max_body_bytes), float(idle_timeout_s)
        self.port: int | None = None
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self, port_range: tuple[int, int] | None = None) -> int:
        """Listen on 127.0.0.1: the first free port of ``port_range`` (inclusive), or one the OS picks; the port."""
        ports = [0] if port_range is None else list(range(int(port_range[0]), int(port_range[1]) + 1))
        for port in ports:
            try:
                self._server = await asyncio.start_server(self._serve, host=HOST, port=port)
            except OSError as problem:
                if problem.errno in (errno.EADDRINUSE, errno.EACCES) and port_range is not None:
                    continue
                raise
            self.port = int(self._server.sockets[0].getsockname()[1])
            return self.port
        raise NoFreePort(f"no free port in {port_range[0]}..{port_range[1]} on {HOST}")  # type: ignore[index]

    async def close(self) -> None:
        """Stop listening and close every open connection (their handlers are cancelled)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            while True:
                try:
                    request = await asyncio.wait_for(self._read(reader, writer), self.idle_timeout_s)
                except _BadRequest as problem:
                    await self._write(writer, HttpResponse.json(problem.status, {"error": {"message": str(problem), "type": "invalid_request_error"}}), False)
                    break
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    break
                if request is None:
                    break
                keep_alive = request.headers.get("connection", "").lower() != "close"
                try:
                    response = await self.handler(request)
                except Exception as error:  # a handler bug answers 500 instead of dropping the connection
                    response = HttpResponse.json(500, {"error": {"message": f"{type(error).__name__}: {error}", "type": "server_error"}})
                await self._write(writer, response, keep_alive)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> HttpRequest | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")  # the request line and headers in one read
        except asyncio.IncompleteReadError as partial:
            if not partial.partial.strip():
                return None  # the client closed the connection between requests
            raise
        except asyncio.LimitOverrunError:
            raise _BadRequest(431, "the request line and headers are longer than 64 KiB") from None
        line, *lines = head.decode("latin-1").split("\r\n")
        parts = line.strip().split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(400, f"not an HTTP/1.x request line: {line[:80]!r}")
        if len(lines) > _MAX_HEADERS + 2:
            raise _BadRequest(431, f"more than {_MAX_HEADERS} headers")
        headers = {}
        for text in lines:
            if text:
                name, _, value = text.partition(":")
                headers[name.strip().lower()] = value.strip()
        if parts[2] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
            headers["connection"] = "close"
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = await self._body(reader, headers)
        return HttpRequest(parts[0].upper(), parts[1].split("?", 1)[0], headers, body)

    @staticmethod
    async def _trailers(reader: asyncio.StreamReader) -> None:
        """A chunked body's trailer lines, read up to the blank line and dropped."""
        for _ in range(_MAX_HEADERS + 1):
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raise _BadRequest(431, "a trailer line is too long") from None
            if line in (b"\r\n", b"\n", b""):
                return
        raise _BadRequest(431, f"more than {_MAX_HEADERS} trailer lines")

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks, size = [], 0
            while True:
                length = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if length == 0:
                    await self._trailers(reader)
                    return b"".join(chunks)
                size += length
                if size > self.max_body_bytes:
                    raise _BadRequest(413, f"the body is larger than {self.max_body_bytes} bytes")
                chunks.append(await reader.readexactly(length))
                await reader.readexactly(2)
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise _BadRequest(400, "Content-Length is not a number") from None
        if length > self.max_body_bytes:
            raise _BadRequest(413, f"the body is larger than {self.max_body_bytes} bytes")
        return await reader.readexactly(length) if length > 0 else b""

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: HttpResponse, keep_alive: bool) -> None:
        reason = HTTPStatus(response.status).phrase if response.status in HTTPStatus._value2member_map_ else ""
        head = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
                f"Content-Length: {len(response.body)}", f"Connection: {'keep-alive' if keep_alive else 'close'}"]
        head += [f"{name}: {value}" for name, value in response.headers]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body)
        await writer.drain()
