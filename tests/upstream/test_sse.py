"""The byte-level SSE decoder yields exactly what httpx-sse's decoders yield on the text,
however the stream is cut into chunks."""

from __future__ import annotations

import codecs
import itertools
import random

import pytest
from httpx_sse._decoders import SSEDecoder as ReferenceDecoder
from httpx_sse._decoders import SSELineDecoder

from proxy.upstream.sse import Event, SSEDecoder

PIECES = (
    b"data: ", b"data:", b"event: error", b"event:x", b": comment", b"id: 7", b"id:\x00",
    b"retry: 10", b"retry: zz", b"\n", b"\r\n", b"\r", b'{"a": 1}', "héllo 你好".encode(),
    b"\xff\xfe", b"[DONE]", b"field", b"  x", b"data: x\n\n",
)


def reference(stream: bytes, cuts: list[int]) -> list[tuple[str, bytes]]:
    """httpx's incremental UTF-8 text decoding, then httpx-sse's line and event decoders."""
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    lines, events = SSELineDecoder(), ReferenceDecoder()
    out = []

    def take(decoded: list[str]) -> None:
        for line in decoded:
            sse = events.decode(line.rstrip("\n"))
            if sse is not None:
                out.append((sse.event, sse.data.encode()))

    for start, end in itertools.pairwise(cuts):
        piece = text.decode(stream[start:end])
        if piece:
            take(lines.decode(piece))
    tail = text.decode(b"", final=True)
    if tail:
        take(lines.decode(tail))
    take(lines.flush())
    return out


def decoded(stream: bytes, cuts: list[int]) -> list[tuple[str, bytes]]:
    decoder = SSEDecoder()
    events: list[Event] = []
    for start, end in itertools.pairwise(cuts):
        events += decoder.feed(stream[start:end])
    events += decoder.flush()
    return [(e.event or "message", e.data) for e in events]


@pytest.mark.parametrize("seed", range(8))
def test_matches_httpx_sse_on_random_streams_and_chunkings(seed: int) -> None:
    """2,000 random streams of SSE fragments (CR/LF/CRLF, comments, ids, bad UTF-8), each
    cut at random places, decode to the same events as httpx + httpx-sse."""
    rng = random.Random(seed)
    for _ in range(2000):
        stream = b"".join(rng.choice(PIECES) for _ in range(rng.randint(1, 30)))
        cuts = sorted({0, len(stream), *(rng.randint(0, len(stream))
                                         for _ in range(rng.randint(0, 6)))})
        assert decoded(stream, cuts) == reference(stream, cuts), (stream, cuts)


def test_returns_every_event_a_chunk_completes() -> None:
    """One chunk holding three events gives all three at once; a partial one waits."""
    decoder = SSEDecoder()
    events = decoder.feed(b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\ndata: {"c"')
    assert [e.data for e in events] == [b'{"a":1}', b'{"b":2}', b"[DONE]"]
    assert [e.data for e in decoder.feed(b":3}\r\n\r\n")] == [b'{"c":3}']


def test_a_crlf_split_across_chunks_is_one_line_end() -> None:
    """A CR at the end of a chunk and the LF starting the next end one line, not two."""
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\ndata: b\r") == []
    assert [e.data for e in decoder.feed(b"\n\r\n")] == [b"a\nb"]
