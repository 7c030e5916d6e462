"""A scripted OpenAI-compatible chat-completions server over real TCP, for the LLM clients' tests.

Each request pops the next Step (answers, an HTTP status, a delay, refusing response_format); with no steps
left it answers `default`. Requests are recorded as the server received them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Step:
    """What the server does for one request."""

    texts: list[str] = field(default_factory=list)
    status: int = 200
    delay_s: float = 0.0
    # Answer 400 when the request asks for response_format (a server without structured output).
    reject_format: bool = False


class Server:
    def __init__(self, default: str = "") -> None:
        self.default = default
        self.steps: list[Step] = []
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append(
                        {"path": self.path, "auth": self.headers.get("Authorization"), **body}
                    )
                    step = outer.steps.pop(0) if outer.steps else Step(texts=[outer.default])
                if step.delay_s:
                    time.sleep(step.delay_s)
                if step.reject_format and "response_format" in body:
                    self._send(
                        400,
                        {
                            "error": {
                                "message": "response_format is not supported",
                                "type": "invalid_request_error",
                            }
                        },
                    )
                    return
                if step.status != 200:
                    self._send(
                        step.status, {"error": {"message": "upstream failure", "type": "server_error"}}
                    )
                    return
                n = int(body.get("n", 1))
                texts = (step.texts * n)[: max(len(step.texts), 1) if len(step.texts) < n else n]
                self._send(
                    200,
                    {
                        "id": "cmpl-1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {
                                "index": i,
                                "message": {"role": "assistant", "content": t},
                                "finish_reason": "stop",
                            }
                            for i, t in enumerate(texts)
                        ],
                        "usage": {
                            "prompt_tokens": 1200,
                            "completion_tokens": 300 * len(texts),
                            "total_tokens": 0,
                        },
                    },
                )

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@contextmanager
def serving(default: str = "") -> Iterator[Server]:
    s = Server(default)
    s.thread.start()
    try:
        yield s
    finally:
        s.httpd.shutdown()
        s.httpd.server_close()
