"""A local OpenAI-compatible chat endpoint: for the demo, the tests and the benchmarks.

It answers POST /v1/chat/completions with the offline responder's reply, after
an optional delay (to stand in for a real model's latency), can serve scripted
faults first (HTTP 500, 429, or a stall past the client's timeout), and keeps
every request body so a caller can check what the workers sent.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from worker.llm import offline_reply

Fault = int | str  # an HTTP status to answer with, or "stall"


class LocalChatServer:
    def __init__(
        self,
        *,
        delay_seconds: float = 0.0,
        faults: list[Fault] | None = None,
        stall_seconds: float = 5.0,
    ) -> None:
        self.delay_seconds = delay_seconds
        self.stall_seconds = stall_seconds
        self.requests: list[dict[str, Any]] = []
        self._faults = list(faults or [])
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> LocalChatServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> LocalChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_fault(self, body: dict[str, Any]) -> Fault | None:
        with self._lock:
            self.requests.append(body)
            return self._faults.pop(0) if self._faults else None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                try:
                    body = json.loads(self.rfile.read(length))
                except ValueError:
                    self._send(400, {"error": "bad json"})
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": "not found"})
                    return
                fault = owner._next_fault(body)
                if fault == "stall":
                    time.sleep(owner.stall_seconds)  # the client's timeout fires first
                    return
                if isinstance(fault, int):
                    self._send(fault, {"error": "scripted fault"})
                    return
                if owner.delay_seconds:
                    time.sleep(owner.delay_seconds)  # a model's thinking time
                reply = offline_reply(body.get("messages", []))
                self._send(200, {"choices": [{"message": {"role": "assistant", "content": reply}}]})

            def _send(self, status: int, data: dict[str, Any]) -> None:
                payload = json.dumps(data).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): nothing to answer

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: request lines would only be noise

        return Handler
