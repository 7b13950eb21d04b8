"""Server-sent events decoded from bytes, as received (WHATWG "event stream interpretation").

The same state machine as httpx-sse's ``SSEDecoder`` (lines end in CRLF, LF or CR; a CR at
the end of a chunk waits for the next one; a blank line dispatches an event when an event
type, data, an id or a retry was seen; ``:`` starts a comment; one space after the colon
is dropped; data lines are joined with LF; at the end of the stream (:meth:`flush`) a
pending line is read, but only a blank line dispatches an event) — on bytes, and every
event completed by a chunk returned at once. The relay so skips text decoding and three
async-generator layers per event, and the forwarder can write all events of one network
read in one go (bench/gateway: streaming cost ~40 µs per relayed event before).

Data is returned as UTF-8 bytes; invalid UTF-8 is replaced (U+FFFD) as httpx's text
decoding did, so the bytes forwarded are what they were before.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    event: str
    data: bytes


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


class SSEDecoder:
    """Feed bytes with :meth:`feed`; it returns the events completed by them."""

    def __init__(self) -> None:
        self._partial = b""
        self._trailing_cr = False
        self._event = ""
        self._data: list[bytes] = []
        self._last_id = ""
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        if self._trailing_cr:
            chunk = b"\r" + chunk
            self._trailing_cr = False
        if chunk.endswith(b"\r"):
            self._trailing_cr = True
            chunk = chunk[:-1]
        if not chunk:
            return []
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = chunk.split(b"\n")
        if self._partial:
            lines[0] = self._partial + lines[0]
        self._partial = lines.pop()  # b"" when the chunk ended with a newline
        events: list[Event] = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def flush(self) -> list[Event]:
        """At the end of the stream: a line cut by a final CR still counts."""
        if not self._partial and not self._trailing_cr:
            return []
        line, self._partial, self._trailing_cr = self._partial, b"", False
        event = self._line(line)
        return [] if event is None else [event]

    def _line(self, line: bytes) -> Event | None:
        if not line:
            if not self._event and not self._data and not self._last_id \
                    and self._retry is None:
                return None
            data = b"\n".join(self._data)
            if not data.isascii():
                data = _text(data).encode()
            event = Event(self._event, data)
            self._event, self._data, self._retry = "", [], None
            return event
        if line.startswith(b":"):
            return None
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = _text(value)
        elif name == b"id":
            if b"\0" not in value:
                self._last_id = _text(value)
        elif name == b"retry":
            with contextlib.suppress(ValueError):
                self._retry = int(value)
        return None
