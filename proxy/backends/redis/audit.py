"""The learning log on Redis Streams: one stream per user, one per tenant (docs/design.md#audit).

A user's events go to ``<prefix>:audit:{u…}`` inside the transaction that makes the change
(:meth:`AuditStreams.queue`, same hash slot); every event is then also appended to the
tenant's ``<prefix>:audit:{t…}`` (:meth:`AuditStreams.append`, another slot, so after
``EXEC``). A crash between the two loses the event from the tenant view only. Events
without a user (shared memories) go to the tenant stream only. The id of each user event
in the tenant stream is also listed under the user (``auditrefs``, kept as long as the
tenant stream could hold it), so "forget me" deletes them without reading the tenant log.

Both streams are trimmed approximately (``XADD … MAXLEN ~``), which trims whole radix-tree
nodes and so costs nothing per append. Ids returned by :meth:`AuditStreams.read` are the
entries' stream ids as integers (``ms × 1000 + seq``,
:func:`~proxy.backends.redis.codec.audit_id`), ordered within the stream read: the user's
when a user is named, else the tenant's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from proxy.backends.redis.codec import audit_entry, audit_from_entry, audit_id, stream_id
from proxy.backends.redis.keys import KeyLayout, tenant_token, user_token
from proxy.memory.store import AuditEvent, AuditFilter

# Entries read per XREVRANGE / XRANGE call when filtering or counting (admin reads).
SCAN_PAGE = 1000

# Erasure: deletes one user's entries from a tenant stream (between ARGV[1] and
# ARGV[4]), one page per call so that Redis serves other clients between pages. An entry
# is the user's when its JSON, as :func:`audit_entry` writes it (``{"at":…,"tenant":…,
# "user_id":…,…}``, orjson, fixed key order), continues at its first ``,"tenant":`` with
# ARGV[3]. Returns the last id read
# (or "" at the end) and the number of entries deleted.
_ERASE_PAGE_LUA = """
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[4], 'COUNT', ARGV[2])
local needle = ARGV[3]
local doomed = {}
for _, entry in ipairs(entries) do
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'e' then
      local json = fields[i + 1]
      local at = string.find(json, ',"tenant":', 1, true)
      if at and string.sub(json, at, at + #needle - 1) == needle then
        doomed[#doomed + 1] = entry[1]
      end
    end
  end
end
for i = 1, #doomed, 500 do
  redis.call('XDEL', KEYS[1], unpack(doomed, i, math.min(i + 499, #doomed)))
end
if #entries < tonumber(ARGV[2]) then return {'', #doomed} end
return {entries[#entries][1], #doomed}
"""
ERASE_PAGE = 5_000  # tenant-stream entries a call reads (~2-5 ms of Redis time a page)

# A learning batch writes ~5-20 events: 10k keeps one user's last ~500-2000 batches.
AUDIT_USER_MAXLEN = 10_000
# 200k events of a tenant, at ~300 bytes an event, is ~60 MB of Redis memory.
AUDIT_TENANT_MAXLEN = 200_000


class AuditStreams:
    """Appends to and reads the audit streams under one key layout."""

    def __init__(self, client: Redis, layout: KeyLayout, *,
                 user_maxlen: int = AUDIT_USER_MAXLEN,
                 tenant_maxlen: int = AUDIT_TENANT_MAXLEN) -> None:
        self._redis = client
        self._keys = layout
        self._user_maxlen = user_maxlen
        self._tenant_maxlen = tenant_maxlen
        self._erase_page = client.register_script(_ERASE_PAGE_LUA)

    def queue(self, pipe: Pipeline, events: Sequence[AuditEvent], ns: str) -> None:
        """Queue on ``pipe`` (a transaction on namespace ``ns``) the events that belong to
        the user stream of ``ns``."""
        for event in events:
            if event.user_id is not None and user_token(event.tenant, event.user_id) == ns:
                pipe.xadd(self._keys.audit(ns), audit_entry(event),  # type: ignore[arg-type]
                          maxlen=self._user_maxlen, approximate=True)

    async def append(self, events: Sequence[AuditEvent], *, written_ns: str | None = None
                     ) -> None:
        """Append ``events`` to their tenant streams, and to user streams other than
        ``written_ns`` (whose events :meth:`queue` already wrote)."""
        if not events:
            return
        owners: list[tuple[str, str | None]] = []  # per tenant xadd: (tenant tok, user ns)
        async with self._redis.pipeline(transaction=False) as pipe:
            for event in events:
                entry = audit_entry(event)
                ns = None
                if event.user_id is not None:
                    ns = user_token(event.tenant, event.user_id)
                    if ns != written_ns:
                        pipe.xadd(self._keys.audit(ns), entry,  # type: ignore[arg-type]
                                  maxlen=self._user_maxlen, approximate=True)
                        owners.append(("", None))
                pipe.xadd(self._keys.audit(tenant_token(event.tenant)),
                          entry,  # type: ignore[arg-type]
                          maxlen=self._tenant_maxlen, approximate=True)
                owners.append((tenant_token(event.tenant), ns))
            ids = await pipe.execute()
        # Where each user's events sit in the tenant log, so that erasure deletes them
        # without reading the whole log; the tenant's first such id marks where the log
        # is covered by refs (older entries are searched).
        async with self._redis.pipeline(transaction=False) as pipe:
            for (tenant_tok, ns), entry_id in zip(owners, ids, strict=True):
                if not tenant_tok:
                    continue
                pipe.set(self._keys.audit_refs(tenant_tok), entry_id, nx=True)
                if ns is not None:
                    pipe.rpush(self._keys.audit_refs(ns), entry_id)
                    pipe.ltrim(self._keys.audit_refs(ns), -self._tenant_maxlen, -1)
            await pipe.execute()

    async def read(self, tenant: str, user: str | None, *, limit: int,
                   before_id: int | None) -> list[tuple[int, AuditEvent]]:
        """Newest first, at most ``limit``, only ids below ``before_id`` when given (none
        below 0 or 1: no entry has id 0, and ``(0-0`` is no range Redis accepts)."""
        if limit <= 0 or (before_id is not None and before_id <= 1):
            return []
        token = tenant_token(tenant) if user is None else user_token(tenant, user)
        newest = "+" if before_id is None else "(" + stream_id(before_id)
        entries: list[tuple[bytes, dict[bytes | str, bytes | str]]] = \
            await self._redis.xrevrange(self._keys.audit(token), newest, "-",
                                        count=limit)  # type: ignore[assignment]
        return [(audit_id(entry_id), audit_from_entry(fields)) for entry_id, fields in entries]

    async def search(self, tenant: str, where: AuditFilter, *, limit: int,
                     before_id: int | None) -> list[tuple[int, AuditEvent]]:
        """Newest first, at most ``limit`` events passing ``where`` with ids below
        ``before_id``: the user's stream when ``where.user`` is set, else the tenant's,
        read in pages of :data:`SCAN_PAGE`. An entry's id is its append time, never before
        its event's ``at``, so the scan stops at the first id older than ``where.since``.
        No event is below ``before_id`` 0 or 1 (as on SQLite, whose ids start at 1)."""
        if limit <= 0 or (before_id is not None and before_id <= 1):
            return []
        token = tenant_token(tenant) if where.user is None else user_token(tenant, where.user)
        key = self._keys.audit(token)
        newest = "+" if before_id is None else "(" + stream_id(before_id)
        floor = "-" if where.since is None else \
            f"{max(0, int(where.since.timestamp() * 1000))}-0"
        found: list[tuple[int, AuditEvent]] = []
        while len(found) < limit:
            entries: list[tuple[bytes, dict[bytes | str, bytes | str]]] = \
                await self._redis.xrevrange(key, newest, floor,
                                            count=SCAN_PAGE)  # type: ignore[assignment]
            for entry_id, fields in entries:
                event = audit_from_entry(fields)
                if event.tenant == tenant and where.matches(event):
                    found.append((audit_id(entry_id), event))
                    if len(found) == limit:
                        break
            if len(entries) < SCAN_PAGE:
                break
            last = entries[-1][0]
            newest = "(" + (last.decode() if isinstance(last, bytes) else str(last))
        return found

    async def counts(self, tenant: str, *, since_ms: int) -> dict[tuple[str, str, str], int]:
        """Events of the tenant stream appended at or after ``since_ms`` (epoch ms),
        counted per (UTC day of ``at``, action, actor)."""
        key = self._keys.audit(tenant_token(tenant))
        start = f"{max(0, since_ms)}-0"
        out: dict[tuple[str, str, str], int] = {}
        while True:
            entries: list[tuple[bytes, dict[bytes | str, bytes | str]]] = \
                await self._redis.xrange(key, start, "+",
                                         count=SCAN_PAGE)  # type: ignore[assignment]
            for _entry_id, fields in entries:
                event = audit_from_entry(fields)
                if event.at.timestamp() * 1000 >= since_ms:
                    day = event.at.astimezone(UTC).date().isoformat()
                    group = (day, event.action, event.actor)
                    out[group] = out.get(group, 0) + 1
            if len(entries) < SCAN_PAGE:
                return out
            last = entries[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else str(last))

    async def erase_user(self, tenant: str, user: str) -> int:
        """Delete the user's stream and the user's entries of the tenant stream: those
        listed in the user's refs (``XDEL``, O(the user's events)), and, among entries
        older than the tenant's first ref (written before refs were kept), those a
        server-side scan finds (:data:`ERASE_PAGE` entries a call). Returns the entries
        deleted from the tenant stream."""
        ns, tenant_tok = user_token(tenant, user), tenant_token(tenant)
        stream = self._keys.audit(tenant_tok)
        refs = [r.decode() if isinstance(r, bytes) else str(r)
                for r in await self._redis.lrange(self._keys.audit_refs(ns), 0, -1)]
        deleted = 0
        for start in range(0, len(refs), 1_000):
            deleted += int(await self._redis.xdel(stream, *refs[start:start + 1_000]))
        await self._redis.unlink(self._keys.audit(ns), self._keys.audit_refs(ns))
        covered = await self._redis.get(self._keys.audit_refs(tenant_tok))
        end = "+" if covered is None else "(" + (
            covered.decode() if isinstance(covered, bytes) else str(covered))
        needle = b',"tenant":' + orjson.dumps(tenant) + b',"user_id":' + \
            orjson.dumps(user) + b","
        start_id = "-"
        while True:
            last, count = await self._erase_page(keys=[stream],
                                                 args=[start_id, ERASE_PAGE, needle, end])
            deleted += int(count)
            last = last.decode() if isinstance(last, bytes) else str(last)
            if not last:
                return deleted
            start_id = "(" + last
