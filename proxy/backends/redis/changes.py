"""Which memories of a namespace changed at which generation: the change log the recall
index refreshes from (docs/design.md#recall-index).

Every write of a namespace's memories moves its generation (``keys.generation``) with
:meth:`ChangeLog.queue`, a script run inside the write's own ``MULTI``: it INCRs the
counter and scores each changed memory id with the new value in ``keys.changes`` (a ZSET,
one member per id: a later change re-scores it). A write that cannot name its memories
(clear, erasure, sweeps) logs the member :data:`UNKNOWN` instead and drops the older
entries: a reader that finds it above its generation reads everything again. The log keeps
the newest :data:`CHANGE_LOG_ENTRIES` ids; the ones dropped raise :data:`UNKNOWN`'s score
to theirs, so a reader older than a dropped entry reads everything too. A reader's
generations come from the same pipeline as the log, read first: every change at or below
them is in the log already (same ``MULTI``).
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from proxy.backends.redis.keys import KeyLayout

UNKNOWN = "*"  # the member of a change no id names: everything may have changed
# Ids a namespace's log keeps (one member per memory id, so a namespace of at most this many
# memories never drops one): 4,000 members of 26-character ULIDs is ~250 KB of Redis memory.
CHANGE_LOG_ENTRIES = 4_000

# KEYS[1] generation, KEYS[2] change log; ARGV[1] entries kept, ARGV[2..] changed ids.
# Returns the new generation.
_BUMP_LUA = """
local g = redis.call('INCR', KEYS[1])
if #ARGV < 2 then
  redis.call('DEL', KEYS[2])
  redis.call('ZADD', KEYS[2], g, '*')
  return g
end
for i = 2, #ARGV do
  if ARGV[i] == '*' then redis.call('DEL', KEYS[2]) end
  redis.call('ZADD', KEYS[2], g, ARGV[i])
end
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[1])
if over > 0 then
  local old = redis.call('ZRANGE', KEYS[2], 0, over - 1, 'WITHSCORES')
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
  redis.call('ZADD', KEYS[2], 'GT', old[#old], '*')
end
return g
"""


class ChangeLog:
    """Move generations and log what moved them (see the module docstring)."""

    def __init__(self, client: Redis, keys: KeyLayout,
                 entries: int = CHANGE_LOG_ENTRIES) -> None:
        self._keys = keys
        self._entries = entries
        self._bump = client.register_script(_BUMP_LUA)

    def queue(self, pipe: Pipeline, ns: str, ids: Sequence[str] | None) -> None:
        """Queue on ``pipe`` (inside the write's ``MULTI``, not in a watching pipeline's
        immediate mode) the generation move of ``ns`` for the memories ``ids`` (``None``:
        unknown — readers reload everything; empty: nothing recall reads changed, no
        move)."""
        if ids is not None and not ids:
            return
        names = [UNKNOWN] if ids is None else list(dict.fromkeys(ids))
        # As redis-py's script call does on a pipeline, without its coroutine: the
        # pipeline loads the script before it runs its commands.
        # redis-py annotates the set as of sync scripts; it holds the async ones too.
        pipe.scripts.add(self._bump)  # type: ignore[arg-type]
        pipe.evalsha(self._bump.sha, 2, self._keys.generation(ns), self._keys.changes(ns),
                     self._entries, *names)

    async def bump(self, *namespaces: str, client: Redis) -> None:
        """Move each of ``namespaces`` for unknown memories, in one ``MULTI``."""
        async with client.pipeline(transaction=True) as pipe:
            for ns in namespaces:
                self.queue(pipe, ns, None)
            await pipe.execute()


def changed_ids(entries: Sequence[tuple[bytes | str, float]], *, since: int,
                now: int) -> set[str] | None:
    """The ids a namespace's log names above generation ``since`` (``entries``: its
    members above it, with scores), given its generation ``now`` read before them;
    ``None`` when the log cannot tell (an :data:`UNKNOWN` change, or a move to ``now``
    that the log does not hold: a write that did not log)."""
    if now == since:
        return set()
    if now < since:  # a counter that went back: nothing here can be trusted
        return None
    ids: set[str] = set()
    logged_now = False
    for member, score in entries:
        name = member.decode() if isinstance(member, bytes) else member
        if name == UNKNOWN:
            return None
        logged_now = logged_now or int(score) >= now
        ids.add(name)
    return ids if logged_now else None
