"""A minimal async client of the endpoint for programs without the ``openai`` package (standard library only).

::

    async def program(*, base_url, api_key, model, sample):
        async with EndpointClient(base_url, api_key) as client:
            reply = await client.chat([{"role": "user", "content": sample["prompt_text"]}])
            text = reply["choices"][0]["message"]["content"]

One keep-alive connection per client; a response other than 2xx raises :class:`EndpointHTTPError` with the
endpoint's error body. With ``openai`` installed, ``AsyncOpenAI(base_url=base_url, api_key=api_key)`` works the same.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

__all__ = ["EndpointClient", "EndpointHTTPError"]


class EndpointHTTPError(RuntimeError):
    """The endpoint answered with an error status; ``body`` is its JSON error."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.body = int(status), body


class EndpointClient:
    """``chat``, ``complete`` and ``request`` against one session's ``base_url`` (``http://127.0.0.1:PORT/s/<id>/v1``)."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 600.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http:// base_url, got {base_url!r}")
        self.host, self.port, self.prefix = parts.hostname, parts.port or 80, parts.path.rstrip("/")
        self.api_key, self.timeout_s = api_key, float(timeout_s)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> "EndpointClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def chat(self, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """``POST /chat/completions`` with ``messages`` and any other fields; the response object."""
        return self._ok(*await self.request("POST", "/chat/completions", {"messages": messages, **fields}))

    async def complete(self, prompt: str | list[int], **fields: Any) -> dict[str, Any]:
        """``POST /completions`` with ``prompt`` (text or token ids) and any other fields; the response object."""
        return self._ok(*await self.request("POST", "/completions", {"prompt": prompt, **fields}))

    @staticmethod
    def _ok(status: int, body: Any) -> dict[str, Any]:
        if not 200 <= status < 300:
            raise EndpointHTTPError(status, body)
        return body

    async def request(self, method: str, route: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """One request; the status and the parsed JSON body (the raw text for a non-JSON body)."""
        payload = b"" if body is None else json.dumps(body).encode()
        head = {"Host": f"{self.host}:{self.port}", "Authorization": f"Bearer {self.api_key}",
                "Content-Type": "application/json", "Content-Length": str(len(payload)), **(headers or {})}
        message = (f"{method} {self.prefix}{route} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n").encode() + payload
        for attempt in (0, 1):  # a keep-alive connection the server closed while idle is opened again, once
            if self._writer is None:
                self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.timeout_s)
            try:
                self._writer.write(message)
                await self._writer.drain()
                return await asyncio.wait_for(self._response(), self.timeout_s)
            except (ConnectionError, asyncio.IncompleteReadError):
                await self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _response(self) -> tuple[int, Any]:
        assert self._reader is not None
        head = await self._reader.readuntil(b"\r\n\r\n")  # IncompleteReadError when the endpoint closed it
        status_line, *lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        length, close = 0, False
        for line in lines:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
            elif name.strip().lower() == "connection" and value.strip().lower() == "close":
                close = True
        data = await self._reader.readexactly(length) if length else b""
        if close:
            await self.close()
        try:
            return status, json.loads(data.decode()) if data else None
        except ValueError:
            return status, data.decode("utf-8", "replace")

    async def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass
