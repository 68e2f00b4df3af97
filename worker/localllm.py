"""A local OpenAI-compatible chat endpoint: for the demo, the tests and the benchmarks.

It answers POST /v1/chat/completions with the offline responder's reply, after
an optional delay (to stand in for a real model's latency), can serve scripted
faults first, and keeps every request body so a caller can check what the
workers sent. Faults, one per request in order:

- an HTTP status (500, 429, ...): that status, an error body;
- "stall": nothing at all for stall_seconds;
- "headers-stall": 200 and headers, then nothing for stall_seconds;
- "trickle": 200 and headers, then whitespace one byte every trickle_seconds,
  until the client goes away (a body that never ends; each read succeeds);
- "bad-json", "no-choices", "content-list", "content-null": a 200 whose body is
  not a chat completion one can use;
- "huge": a 200 body of HUGE_BODY_BYTES, no Content-Length (read until close).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from worker.llm import offline_reply

Fault = int | str  # an HTTP status to answer with, or a named fault (module docstring)

HUGE_BODY_BYTES = 12 << 20
TRICKLE_BODY_BYTES = 1 << 20  # declared, so a client cannot refuse it up front
# Malformed 200 bodies; each holds MARK, which must never reach a log or a reply.
MARK = "LEAKED-BODY-TEXT"
MALFORMED: dict[str, bytes] = {
    "bad-json": b'{"choices": [{"message": {"content": "' + MARK.encode() + b'"',
    "no-choices": json.dumps({"error": MARK, "choices": []}).encode(),
    "content-list": json.dumps(
        {"choices": [{"message": {"content": [{"type": "text", "text": MARK}]}}]}
    ).encode(),
    "content-null": json.dumps({"choices": [{"message": {"content": None, "x": MARK}}]}).encode(),
}


class LocalChatServer:
    def __init__(
        self,
        *,
        delay_seconds: float = 0.0,
        faults: list[Fault] | None = None,
        stall_seconds: float = 5.0,
        trickle_seconds: float = 0.05,
    ) -> None:
        self.delay_seconds = delay_seconds
        self.stall_seconds = stall_seconds
        self.trickle_seconds = trickle_seconds
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
        return type("Handler", (_Handler,), {"owner": self})


class _Handler(BaseHTTPRequestHandler):
    owner: LocalChatServer

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
        fault = self.owner._next_fault(body)
        if fault is None:
            if self.owner.delay_seconds:
                time.sleep(self.owner.delay_seconds)  # a model's thinking time
            reply = offline_reply(body.get("messages", []))
            self._send(200, {"choices": [{"message": {"role": "assistant", "content": reply}}]})
        elif isinstance(fault, int):
            self._send(fault, {"error": "scripted fault"})
        elif fault == "stall":
            time.sleep(self.owner.stall_seconds)  # the client's timeout fires first
        elif fault in MALFORMED:
            self._send_raw(200, MALFORMED[fault])
        else:
            self._misbehave(fault)

    def _misbehave(self, fault: str) -> None:
        """headers-stall, trickle, huge: a 200 whose body does not come, or never ends."""
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if fault != "huge":
                self.send_header("Content-Length", str(TRICKLE_BODY_BYTES))
            self.end_headers()
            self.wfile.flush()
            if fault == "headers-stall":
                time.sleep(self.owner.stall_seconds)
            elif fault == "trickle":
                for _ in range(TRICKLE_BODY_BYTES):  # until the client hangs up
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(self.owner.trickle_seconds)
            else:
                block = b" " * (1 << 16)
                for _ in range(HUGE_BODY_BYTES // len(block)):
                    self.wfile.write(block)
                self.wfile.write(b"{}")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: as it should

    def _send(self, status: int, data: dict[str, Any]) -> None:
        self._send_raw(status, json.dumps(data).encode())

    def _send_raw(self, status: int, payload: bytes) -> None:
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
