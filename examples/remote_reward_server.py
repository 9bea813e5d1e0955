"""A reference reward service for ``roles.reward.remote``: the bundled digits task's reward over HTTP (stdlib only).

Run it, then point a recipe at it::

    python examples/remote_reward_server.py --port 8123
    rlhfctl train recipes/quickstart.yaml roles.reward.remote.url=http://127.0.0.1:8123/score \\
        'roles.reward.remote.columns=[ground_truth]'

It binds 127.0.0.1 only. Each request is one batch (``POST /score``, ``Content-Type: application/json``)::

    {"prompts": ["digits 4 7 1:", ...], "responses": ["471", ...], "ground_truth": ["471", ...]}

``ground_truth`` (or any other column) is there when the recipe lists it in ``roles.reward.remote.columns``. The
answer has one score per response, the fraction of its characters that are digits (what
``rlhfctl.tasks.digits:score`` computes), and named scores in ``extra`` (logged as ``reward/<name>/mean``)::

    {"scores": [1.0, ...], "extra": {"length": [3.0, ...], "exact": [1.0, ...]}}

``length`` is each response's length in characters; ``exact`` (1.0 when the response is the ground truth, else
0.0) is there when the request carries ``ground_truth``. A request that is not a JSON object with lists
``prompts`` and ``responses`` of one length is answered HTTP 400 with ``{"error": "..."}``.

With ``--key-env VAR`` the service wants the header ``X-Api-Key: <the value of VAR>`` (HTTP 401 otherwise); a recipe
sends it with ``roles.reward.remote.headers_from_env: {X-Api-Key: VAR}``, VAR set where the reward worker runs.
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_DIGITS = frozenset("0123456789")


def score_batch(request: dict[str, Any]) -> dict[str, Any]:
    """The answer to one request: digit fractions as scores, and the named scores in ``extra``."""
    prompts, responses = request.get("prompts"), request.get("responses")
    if not isinstance(prompts, list) or not isinstance(responses, list) or len(prompts) != len(responses):
        raise ValueError("expected lists 'prompts' and 'responses' of one length")
    scores = [sum(char in _DIGITS for char in str(text)) / len(text) if text else 0.0 for text in responses]
    extra = {"length": [float(len(str(text))) for text in responses]}
    truths = request.get("ground_truth")
    if isinstance(truths, list) and len(truths) == len(responses):
        extra["exact"] = [1.0 if str(text).strip() == str(truth) else 0.0 for text, truth in zip(responses, truths)]
    return {"scores": scores, "extra": extra}


class RewardHandler(BaseHTTPRequestHandler):
    """``POST /score``: one batch in, its scores out (JSON both ways)."""

    api_key: str | None = None  # the X-Api-Key a request must carry; None: any request is answered

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        """Score the batch in the request's body."""
        if self.api_key is not None and self.headers.get("X-Api-Key") != self.api_key:
            self._reply(401, {"error": "missing or wrong X-Api-Key header"})
            return
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            answer = score_batch(request if isinstance(request, dict) else {})
        except ValueError as error:
            self._reply(400, {"error": str(error)})
            return
        self._reply(200, answer)

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        """Quiet: one line per request would drown a run's output."""


def make_server(port: int = 0, api_key: str | None = None) -> ThreadingHTTPServer:
    """A server on 127.0.0.1 (``port`` 0: a free one, read it from ``server.server_address[1]``), not yet serving."""
    handler = type("ConfiguredRewardHandler", (RewardHandler,), {"api_key": api_key})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


def main() -> None:
    """Serve until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8123, help="port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--key-env", default=None, help="environment variable holding the X-Api-Key to require")
    args = parser.parse_args()
    api_key = os.environ[args.key_env] if args.key_env else None
    server = make_server(args.port, api_key)
    print(f"reward service on http://127.0.0.1:{server.server_address[1]}/score", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
