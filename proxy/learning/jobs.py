"""The payload of every learning job kind: built, serialised and parsed here only.

A queue stores a job's payload as opaque bytes beside the envelope it indexes (id, kind,
tenant, due time, attempts — :class:`~proxy.learning.queue.Job`); only this module knows
what the bytes hold. The bytes are JSON (orjson) and their shape is fixed — jobs queued by
an earlier version must still parse:

- ``exchange`` — :meth:`Exchange.to_json` of one completed turn; id ``exchange:<id>``.
- ``flush`` — ``{"tenant", "user"}`` (every buffered conversation of the user: the
  explicit flush) or ``{"tenant", "user", "conversation"}`` (that conversation: the idle
  flush); id ``flush:<tenant>:<user>:<unique>`` or ``flush:<tenant>:<user>:<conversation>``
  (one id per conversation, so while its idle flush waits, maintenance adds no other).
- ``learn`` — ``{"batch": <batch key>}``; id ``learn:<batch key>``.

:func:`blank_exchange` rewrites an ``exchange`` payload without its content (a user's
memory cleared while the job waits), for the backends that keep queued payloads;
:func:`names_user` says whether an ``exchange`` or ``flush`` payload names a user (an
erased user's jobs are deleted: docs/design.md#erasure).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.learning.exchange import Exchange
from proxy.learning.queue import NewJob


def exchange_job(exchange: Exchange) -> NewJob:
    """The ``exchange`` job of one turn, under the exchange's tenant."""
    return NewJob("exchange", f"exchange:{exchange.id}", orjson.dumps(exchange.to_json()),
                  exchange.tenant)


def read_exchange(payload: bytes) -> Exchange:
    """The turn an ``exchange`` payload holds. Raises ``orjson.JSONDecodeError`` /
    ``KeyError`` on a payload of another shape (the job then fails and is retried)."""
    data: dict[str, Any] = orjson.loads(payload)
    return Exchange.from_json(data)


@dataclass(frozen=True, slots=True)
class Flush:
    """Seal ``conversation`` of (tenant, user), or — ``None`` or empty — every
    conversation the user has buffered."""

    tenant: str
    user: str
    conversation: str | None = None

    def to_bytes(self) -> bytes:
        data = {"tenant": self.tenant, "user": self.user}
        if self.conversation is not None:
            data["conversation"] = self.conversation
        return orjson.dumps(data)

    @classmethod
    def from_bytes(cls, payload: bytes) -> Flush:
        """Raises ``KeyError`` without tenant or user."""
        data = orjson.loads(payload)
        return cls(tenant=data["tenant"], user=data["user"],
                   conversation=data.get("conversation"))


def flush_job(flush: Flush, *, unique: str | None = None) -> NewJob:
    """The ``flush`` job of ``flush``. An explicit flush passes a fresh ``unique`` to end
    its id. An idle flush passes none: its id names only the conversation, so a queue that
    already holds it (ready, delayed, leased or dead) ignores the new one — at most one
    pending idle flush per conversation however far the worker is behind — while one that
    ran and was acknowledged leaves the id free for the next idle period."""
    parts = [flush.tenant, flush.user, *([flush.conversation] if flush.conversation
                                         is not None else []),
             *([unique] if unique is not None else [])]
    return NewJob("flush", "flush:" + ":".join(parts), flush.to_bytes(), flush.tenant)


def learn_job(batch_key: str, tenant: str) -> NewJob:
    """The ``learn`` job of a sealed batch (one per batch: the id is the batch key's)."""
    return NewJob("learn", f"learn:{batch_key}", learn_payload(batch_key), tenant)


def learn_payload(batch_key: str) -> bytes:
    return orjson.dumps({"batch": batch_key})


def read_learn(payload: bytes) -> str:
    """The batch key of a ``learn`` payload. Raises ``KeyError`` without one."""
    key: str = orjson.loads(payload)["batch"]
    return key


def blank_exchange(payload: bytes | str, tenant: str, user: str) -> bytes | None:
    """The content-free version of an exchange job's payload when it belongs to (tenant,
    user) — as the learning owner or the group speaker — and still holds messages or a
    display name: no messages (so no text, image or fingerprint) and no display name; else
    ``None`` (another user's job, another kind of job, or already blank)."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list) or \
            data.get("tenant") != tenant or user not in (data.get("user"),
                                                         data.get("speaker")):
        return None
    if not data["messages"] and not data.get("speaker_name"):
        return None
    # Nothing of the turn stays: no text, no fingerprint (a worker would record it as seen
    # again after the erasure), no display name (it would be bound to the user again).
    data["messages"], data["speaker_name"] = [], None
    return orjson.dumps(data)


def names_user(kind: str, payload: bytes | str, tenant: str, user: str) -> bool:
    """Whether a queued job of ``kind`` names (tenant, user): an ``exchange`` whose
    learning owner or group speaker is the user, or a ``flush`` of the user (explicit or
    idle). ``learn`` payloads name a batch, not a user (the backends match those by their
    batch keys); a payload of another shape names nobody."""
    if kind not in ("exchange", "flush"):
        return False
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(data, dict) or data.get("tenant") != tenant:
        return False
    if kind == "flush":
        return bool(data.get("user") == user)
    return user in (data.get("user"), data.get("speaker"))
