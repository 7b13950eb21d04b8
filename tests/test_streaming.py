"""The forwarder writes events that arrived together in one body message, and never holds
back one that arrived alone."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import orjson

from proxy.streaming import DONE, StreamForwarder, frame
from proxy.transcript import Usage
from tests.fakes import text_chunks


class ReadsStream:
    """A BufferedChunkStream fake: each inner list is what one network read delivered."""

    def __init__(self, reads: Sequence[Sequence[bytes]]) -> None:
        self._reads = deque(deque(r) for r in reads)
        self.headers: dict[str, str] = {}
        self.closed = False

    @property
    def ready(self) -> int:
        """Payloads left in the current read, plus the end when that read is the last."""
        if not self._reads:
            return 0
        return len(self._reads[0]) + (1 if len(self._reads) == 1 else 0)

    def __aiter__(self) -> ReadsStream:
        return self

    async def __anext__(self) -> bytes:
        while self._reads and not self._reads[0]:
            self._reads.popleft()
        if not self._reads:
            raise StopAsyncIteration
        return self._reads[0].popleft()

    async def aclose(self) -> None:
        self.closed = True


async def forward(reads: Sequence[Sequence[bytes]]) -> list[bytes]:
    forwarder = StreamForwarder(ReadsStream(reads), include_usage=False,
                                estimate_usage=lambda _a: Usage(1, 1, 2))
    await forwarder.start()
    return [part async for part in forwarder.body()]


PAYLOADS = [orjson.dumps(c) for c in text_chunks("Hello there", pieces=3)]


async def test_events_of_one_read_go_out_in_one_message() -> None:
    """A whole stream in one read: the first content at once, the rest in one body
    message, bytes unchanged."""
    parts = await forward([PAYLOADS])
    first_substantive = 2  # the role chunk carries no content: held until "Hel"
    assert parts == [b"".join(frame(p) for p in PAYLOADS[:first_substantive]),
                     b"".join(frame(p) for p in PAYLOADS[first_substantive:]) + DONE]


async def test_events_read_separately_are_not_held_back() -> None:
    """One event per read: each is written as soon as it arrives (after the first
    substantive one, which start() waits for)."""
    parts = await forward([[p] for p in PAYLOADS])
    first_substantive = 2  # the role chunk carries no content: held until "Hel"
    expected = [b"".join(frame(p) for p in PAYLOADS[:first_substantive])]
    expected += [frame(p) for p in PAYLOADS[first_substantive:]]
    expected[-1] += DONE  # the end came with the last event
    assert parts == expected
