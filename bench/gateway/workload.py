"""The requests every target gets: the same chat, as raw HTTP/1.1 bytes.

A short conversation — system prompt, a greeting exchange, then one of the seeded questions
(:func:`bench.gateway.seed.questions`) — with ``max_tokens`` set, streaming or not. The
memory-on variant adds ``X-User-Id`` (the seeded user); everything else is byte-identical
across targets apart from the ``host`` header.
"""

from __future__ import annotations

import orjson

from bench.gateway import seed
from bench.gateway.load import build_request
from bench.gateway.targets import CLIENT_KEY

PATH = "/v1/chat/completions"
MODEL = "gpt-4o-mini"
PACED_MODEL = MODEL + "-paced"  # the fake upstream spaces this model's stream events
SYSTEM = "You are a helpful assistant. Answer briefly and precisely."


def chat_body(question: str, *, stream: bool, model: str = MODEL) -> bytes:
    return orjson.dumps({
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Hi! I have a couple of questions today."},
            {"role": "assistant", "content": "Of course — what would you like to know?"},
            {"role": "user", "content": question},
        ],
        "max_tokens": 256,
        "stream": stream,
    })


def chat_request(port: int, question: str, *, stream: bool, user: str | None,
                 model: str = MODEL) -> bytes:
    headers = [("authorization", f"Bearer {CLIENT_KEY}")]
    if user is not None:
        headers.append(("x-user-id", user))
    return build_request(port=port, path=PATH,
                         body=chat_body(question, stream=stream, model=model), headers=headers)


def payloads(port: int, *, user: str | None) -> dict[str, list[bytes]]:
    """Requests for each seeded question, by scenario kind (json, stream, paced)."""
    kinds = {"json": (False, MODEL), "stream": (True, MODEL), "paced": (True, PACED_MODEL)}
    return {kind: [chat_request(port, q, stream=stream, user=user, model=model)
                   for q in seed.questions()]
            for kind, (stream, model) in kinds.items()}
