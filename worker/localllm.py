"""A local OpenAI-compatible chat endpoint: for the demo, the tests and the benchmarks.

It answers POST /v1/chat/completions with the offline responder's reply, after
an optional delay (to stand in for a real model's latency), can serve scripted
faults first, and keeps every request body so a caller can check what the
workers sent. Faults, one per request in order:

- an HTTP status (500, 429, ...): that status, an error body;
- "stall": nothing at all for stall_seconds;
- "drop": the connection closed with no answer (a transport error to the client);
- "headers-stall": 200 and headers, then nothing for stall_seconds;
- "trickle": 200 and headers, then whitespace one byte every trickle_seconds,
  until the client goes away (a body that never ends; each read succeeds);
- "bad-json", "no-choices", "content-list", "content-null", "content-blank": a 200
  whose body is not a chat completion one can use;
- "huge": a 200 body of HUGE_BODY_BYTES, no Content-Length (read until close).

It is an asyncio server on its own thread and event loop (HTTP/1.1 keep-alive, a
listen backlog of BACKLOG), so a delay is a timer, not a thread: it serves
thousands of requests in flight at once with the same latency, and a benchmark
that measures the service against it measures the service (issue 16: the old
thread-per-request HTTP/1.0 server with a backlog of 5 failed from 32 clients on).

    python -m worker.localllm --delay 2 [--port 0]

runs one on its own (it prints its URL), e.g. for a benchmark's yardstick.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
from typing import Any
from typing import Self

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
    "content-blank": json.dumps({"choices": [{"message": {"content": " \n", "x": MARK}}]}).encode(),
}
# Connections the kernel queues before accept: more than any benchmark's client opens.
BACKLOG = 4096
MAX_REQUEST_BYTES = 16 << 20
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests"}


class _Close(Exception):
    """The connection ends after this answer (a body without a length, a client gone)."""


class LocalChatServer:
    def __init__(
        self,
        *,
        delay_seconds: float = 0.0,
        faults: list[Fault] | None = None,
        stall_seconds: float = 5.0,
        trickle_seconds: float = 0.05,
        port: int = 0,
    ) -> None:
        self.delay_seconds = delay_seconds
        self.stall_seconds = stall_seconds
        self.trickle_seconds = trickle_seconds
        self.requests: list[dict[str, Any]] = []
        # each request's raw body and its headers (lower-cased names), in order: a test
        # checks what a client sent, a secret included; nothing here is ever printed
        self.raw: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.most_in_flight = 0  # the most requests held at once (a test or bench reads it)
        # (start, end) in time.monotonic() seconds and the body of each answered request
        self.spans: list[tuple[float, float, dict[str, Any]]] = []
        self._faults = list(faults or [])
        self._lock = threading.Lock()
        self._port = port
        self._address: tuple[str, int] | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="localllm")

    @property
    def url(self) -> str:
        if self._address is None:
            raise RuntimeError("the server is not started")
        host, port = self._address
        return f"http://{host}:{port}/v1"

    def start(self) -> Self:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(
                    self._connection,
                    "127.0.0.1",
                    self._port,
                    backlog=BACKLOG,
                    limit=MAX_REQUEST_BYTES,
                )
            )
            self._address = self._server.sockets[0].getsockname()[:2]
        except BaseException as exc:  # handed to start()'s caller
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    def _next_fault(
        self, body: dict[str, Any], raw: bytes, headers: dict[str, str]
    ) -> Fault | None:
        with self._lock:
            self.requests.append(body)
            self.raw.append(raw)
            self.headers.append(headers)
            return self._faults.pop(0) if self._faults else None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: requests one after another (keep-alive) until it closes."""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, headers = _parse_head(head)
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                await self._answer(method, path, body, headers, writer)
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, _Close):
            pass  # the client went away, or this answer ends the connection
        except ValueError:
            with contextlib.suppress(ConnectionError):
                await _send(writer, 400, {"error": "bad request"})
        except asyncio.CancelledError:
            return  # stop(): the loop ends; a cancelled handler would only log noise
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(
        self,
        method: str,
        path: str,
        raw: bytes,
        headers: dict[str, str],
        writer: asyncio.StreamWriter,
    ) -> None:
        try:
            body = json.loads(raw)
        except ValueError:
            await _send(writer, 400, {"error": "bad json"})
            return
        if method != "POST" or path.rstrip("/") != "/v1/chat/completions":
            await _send(writer, 404, {"error": "not found"})
            return
        fault = self._next_fault(body, raw, headers)
        self.in_flight += 1  # only the loop's thread changes it
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        began = time.monotonic()
        try:
            await self._respond(fault, body, writer)
        finally:
            self.in_flight -= 1
            self.spans.append((began, time.monotonic(), body))

    async def _respond(self, fault: Fault | None, body: Any, writer: asyncio.StreamWriter) -> None:
        if fault is None:
            if self.delay_seconds:
                await asyncio.sleep(self.delay_seconds)  # a model's thinking time
            reply = offline_reply(body.get("messages", []) if isinstance(body, dict) else [])
            message = {"role": "assistant", "content": reply}
            await _send(writer, 200, {"choices": [{"message": message}]})
        elif isinstance(fault, int):
            await _send(writer, fault, {"error": "scripted fault"})
        elif fault == "stall":
            await asyncio.sleep(self.stall_seconds)  # the client's timeout fires first
            raise _Close
        elif fault == "drop":
            raise _Close  # closed unanswered: the client sees the server disconnect
        elif fault in MALFORMED:
            await _send_raw(writer, 200, MALFORMED[fault])
        else:
            await self._misbehave(fault, writer)

    async def _misbehave(self, fault: str, writer: asyncio.StreamWriter) -> None:
        """headers-stall, trickle, huge: a 200 whose body does not come, or never ends."""
        length = "" if fault == "huge" else f"Content-Length: {TRICKLE_BODY_BYTES}\r\n"
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}\r\n".encode())
        await writer.drain()
        if fault == "headers-stall":
            await asyncio.sleep(self.stall_seconds)
        elif fault == "trickle":
            for _ in range(TRICKLE_BODY_BYTES):  # until the client hangs up
                if writer.is_closing():
                    break
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(self.trickle_seconds)
        else:
            block = b" " * (1 << 16)
            for _ in range(HUGE_BODY_BYTES // len(block)):
                writer.write(block)
                await writer.drain()
            writer.write(b"{}")
            await writer.drain()
        raise _Close  # no length given (or a body cut short): the close ends it


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, path and lower-cased headers of a request head; ValueError if malformed."""
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if not headers.get("content-length", "0").isdigit():
        raise ValueError("bad Content-Length")
    return method, path, headers


async def _send(writer: asyncio.StreamWriter, status: int, data: dict[str, Any]) -> None:
    await _send_raw(writer, status, json.dumps(data).encode())


async def _send_raw(writer: asyncio.StreamWriter, status: int, payload: bytes) -> None:
    reason = _REASONS.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    await writer.drain()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A local OpenAI-compatible endpoint.")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per answer")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    args = parser.parse_args(argv)
    server = LocalChatServer(delay_seconds=args.delay, port=args.port).start()
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
