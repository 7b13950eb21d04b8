"""A cheap OpenAI-compatible upstream for benchmarks: one asyncio protocol, no framework.

``POST …/chat/completions`` answers like OpenAI:

- non-streaming: a ``chat.completion`` body with the reply and ``usage``
  (``Content-Length``);
- streaming (``"stream": true``): ``chunks`` ``chat.completion.chunk`` events — the first
  carries ``role``, the middle ones the reply's pieces, the last ``finish_reason: "stop"``
  with an empty delta — then a usage-only chunk (``"choices": []``) when the request asked
  for it (``stream_options.include_usage``; ``--usage always|never`` overrides), then
  ``data: [DONE]``. By default the whole stream goes out in one write (one burst, chunked
  transfer encoding); ``--interval-ms`` spaces the events instead.

A model whose id ends with ``-paced`` is streamed with ``--paced-ms`` (10 ms, ×0.5–1.5 at
random per stream so concurrent streams do not stay in lockstep) between events instead: a
stream that lasts like a real one, so concurrent streams overlap without saturating the
server under test. ``GET …/models`` lists a model; anything else is a 404 in OpenAI's
error envelope. A non-streaming request with ``response_format`` (the learning worker's
scoring and extraction calls) is answered with a JSON object of that shape instead
(:func:`learning_answer`): every batch scores 0.8 and yields one fact, so learning does
its whole pipeline at no model cost. HTTP/1.1 keep-alive, parsed with httptools; request
bodies are parsed with orjson only to read ``stream``, ``stream_options``, ``model`` and
``response_format``. Cost per request is a few tens of µs, so the benchmark measures the
gateway, not this server.

    python -m bench.gateway.fake_upstream --port 18001 [--chunks 20] [--usage auto]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import time
from typing import Any, Literal, cast

import httptools
import orjson

UsageMode = Literal["auto", "always", "never"]
REPLY_WORDS = (
    "Sure", "—", "here", "is", "a", "short", "answer", "that", "a", "benchmark", "upstream",
    "sends", "back", "in", "small", "pieces", "like", "a", "real", "model", "would", "stream",
    "them", "to", "the", "client", "one", "token", "at", "a", "time", ".",
)


def reply_pieces(count: int) -> list[str]:
    """``count`` content pieces (words with their leading space)."""
    words = itertools.islice(itertools.cycle(REPLY_WORDS), max(1, count))
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


class Responder:
    """Builds the response bytes for one request (pure; shared by every connection)."""

    def __init__(self, *, chunks: int, usage: UsageMode, interval_ms: float,
                 paced_ms: float = 10.0) -> None:
        self.chunks = max(2, chunks)
        self.usage = usage
        self.interval = interval_ms / 1000
        self.paced = paced_ms / 1000
        self._ids = itertools.count(1)
        self._pieces = reply_pieces(self.chunks - 2)
        self.reply = "".join(self._pieces)
        self.completion_tokens = len(self._pieces)

    def completion(self, model: str, prompt_tokens: int, content: str | None = None) -> bytes:
        """A ``chat.completion`` reply; ``content`` replaces the canned reply text."""
        body = orjson.dumps({
            "id": f"chatcmpl-bench{next(self._ids)}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "system_fingerprint": "fp_bench",
            "choices": [{"index": 0, "message": {"role": "assistant",
                                                 "content": content or self.reply,
                                                 "refusal": None},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": self._usage(prompt_tokens),
        })
        return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"x-request-id: req_bench\r\ncontent-length: " + str(len(body)).encode()
                + b"\r\n\r\n" + body)

    def stream_events(self, model: str, prompt_tokens: int, include_usage: bool) -> list[bytes]:
        """The SSE events of one streamed reply, ``[DONE]`` included."""
        cid = f"chatcmpl-bench{next(self._ids)}"
        created = int(time.time())

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created,
                     "model": model, "system_fingerprint": "fp_bench", "choices": choices,
                     **extra}
            return b"data: " + orjson.dumps(chunk) + b"\n\n"

        out = [event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                       "logprobs": None, "finish_reason": None}])]
        out.extend(event([{"index": 0, "delta": {"content": p}, "logprobs": None,
                           "finish_reason": None}]) for p in self._pieces)
        out.append(event([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]))
        if self.usage == "always" or (self.usage == "auto" and include_usage):
            out.append(event([], usage=self._usage(prompt_tokens)))
        out.append(b"data: [DONE]\n\n")
        return out

    def _usage(self, prompt_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": prompt_tokens + self.completion_tokens}


SCORING_ANSWER = orjson.dumps({
    "score": 0.8, "reason": "a benchmark batch",
    "dimensions": {"density": 0.8, "clarity": 0.8, "depth": 0.8, "relevance": 0.8,
                   "novelty": 0.8},
}).decode()
EXTRACTION_ANSWER = orjson.dumps({
    "memories": [{"title": "Gateway benchmark", "content": "User is load testing a gateway.",
                  "category": "technical", "subcategory": "stack", "tags": ["load testing"],
                  "subject": "user"}],
    "summary": None, "profile": None,
}).decode()


def learning_answer(body: dict[str, Any]) -> str | None:
    """The JSON text for a request with ``response_format``, else ``None``. Scoring is
    told from extraction by the schema's name (``json_schema``) or its ``dimensions``
    property; a bare ``json_object`` request, by the word ``novelty`` of the scoring
    prompt."""
    form = body.get("response_format")
    if not isinstance(form, dict):
        return None
    named = form.get("json_schema")
    schema = named.get("schema") if isinstance(named, dict) else form.get("schema")
    if isinstance(named, dict) and named.get("name") in ("scoring", "extraction"):
        scoring = named.get("name") == "scoring"
    elif isinstance(schema, dict):
        scoring = "dimensions" in (schema.get("properties") or {})
    else:
        scoring = b"novelty" in orjson.dumps(body.get("messages"))
    return SCORING_ANSWER if scoring else EXTRACTION_ANSWER


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
               b"x-request-id: req_bench\r\ncache-control: no-cache\r\n"
               b"transfer-encoding: chunked\r\n\r\n")


_PACING: set[asyncio.Task[None]] = set()  # running paced streams (strong references)
_JITTER = random.Random(11)


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def simple(status: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


class UpstreamProtocol(asyncio.Protocol):
    """One client connection (keep-alive, requests answered in order)."""

    def __init__(self, responder: Responder) -> None:
        self._responder = responder
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.write(simple("400 Bad Request", b'{"error":"bad request"}'))
                self._transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        method = self._parser.get_method()
        path = self._url.split(b"?", 1)[0]
        if method == b"POST" and path.endswith(b"/chat/completions"):
            self._chat(transport, b"".join(self._body))
        elif method == b"GET" and path.endswith(b"/models"):
            transport.write(simple("200 OK", b'{"object":"list","data":[{"id":"gpt-4o-mini",'
                                             b'"object":"model","owned_by":"bench"}]}'))
        else:
            transport.write(simple("404 Not Found", b'{"error":{"message":"not found",'
                                                    b'"type":"invalid_request_error"}}'))
        if not self._parser.should_keep_alive():
            transport.close()

    def _chat(self, transport: asyncio.Transport, raw: bytes) -> None:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            transport.write(simple("400 Bad Request", b'{"error":{"message":"invalid json",'
                                                      b'"type":"invalid_request_error"}}'))
            return
        model = str(body.get("model") or "gpt-4o-mini")
        prompt_tokens = max(1, len(raw) // 4)  # a stand-in; nobody checks the count
        if not body.get("stream"):
            transport.write(self._responder.completion(model, prompt_tokens,
                                                       learning_answer(body)))
            return
        options = body.get("stream_options")
        include = isinstance(options, dict) and bool(options.get("include_usage"))
        events = self._responder.stream_events(model, prompt_tokens, include)
        interval = self._responder.interval
        if model.endswith("-paced"):
            interval = self._responder.paced * _JITTER.uniform(0.5, 1.5)
        if interval <= 0:
            transport.write(STREAM_HEAD + chunked(b"".join(events)) + b"0\r\n\r\n")
            return
        transport.write(STREAM_HEAD)
        task = asyncio.get_running_loop().create_task(self._paced(transport, events, interval))
        _PACING.add(task)
        task.add_done_callback(_PACING.discard)

    async def _paced(self, transport: asyncio.Transport, events: list[bytes],
                     interval: float) -> None:
        for index, event in enumerate(events):
            if index:
                await asyncio.sleep(interval)
            if transport.is_closing():
                return
            transport.write(chunked(event))
        transport.write(b"0\r\n\r\n")


async def serve(*, host: str, port: int, responder: Responder) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: UpstreamProtocol(responder), host, port,
                                      backlog=1024, reuse_address=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=20,
                        help="chat.completion.chunk events per streamed reply (≥ 2)")
    parser.add_argument("--usage", choices=("auto", "always", "never"), default="auto",
                        help="usage chunk: when asked (auto), always, never")
    parser.add_argument("--interval-ms", type=float, default=0.0,
                        help="pause between streamed events (0: one burst)")
    parser.add_argument("--paced-ms", type=float, default=10.0,
                        help="pause between streamed events for models named '*-paced'")
    args = parser.parse_args(argv)
    responder = Responder(chunks=args.chunks, usage=args.usage, interval_ms=args.interval_ms,
                          paced_ms=args.paced_ms)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        asyncio.run(serve(host=args.host, port=args.port, responder=responder))
    else:
        uvloop.run(serve(host=args.host, port=args.port, responder=responder))


if __name__ == "__main__":
    main()
