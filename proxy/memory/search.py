"""Ranked memory search for the readers of the memory API — ``GET /v1/memories?q=``, the
MCP tool ``search_memories`` and the console (docs/design.md#search).

A search ranks exactly as chat recall does: the :class:`~proxy.memory.retrieve.Retriever`
runs the query's keyword (BM25) and, with an embedder, vector searches, and
:func:`~proxy.memory.recall.rank` scores the candidates with the same weights — so a
question chat recall answers from a memory finds that memory here, best match first.
Around that:

1. **Filters.** Recall's candidates are kept when the listing would show them with the
   same filters (category, scope, enabled, source: :func:`admits`).
2. **Memories recall never sees.** Retired and disabled memories are not in the recall
   index; when the filters ask for them they are read through
   :meth:`~proxy.memory.store.MemoryStore.list_memories` (:func:`inactive`, at most
   :data:`SEARCH_SCAN`), and one that contains query words (the substring
   rule of the listing: :func:`~proxy.memory.text.query_terms` without sub-words, in the
   normalised content or the title) counts as a keyword hit scored ``best BM25 × share of
   the query words it contains``.
3. **Every match.** Near-duplicates stay (``distinct_only=False``); a candidate of no
   relevance (a vector neighbour pointing away from the query) is left out.
4. **Paging.** The ranked list is recomputed per page; ``after`` takes the page token
   of the previous page (:func:`page_token`, opaque to clients, carried in ``last_id``) or a
   memory id of the results, ``offset`` skips further. A token whose memory is gone
   continues at the position it recorded, less the slot that memory held.

Access counters are not touched: a search is a read, as the listing is.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, replace
from datetime import datetime

from proxy.errors import InvalidRequestError
from proxy.memory.recall import QueryHits, rank
from proxy.memory.records import Memory
from proxy.memory.retrieve import Retriever
from proxy.memory.store import Candidate, ListQuery, MemoryStore
from proxy.memory.text import load_segmenter_for, normalize, query_terms
from proxy.memory.when import mentioned_periods

# Most memories one search ranks: 20 × the default per-user quota
# (learning.max_memory_per_user, 500), room for a tenant's shared space.
SEARCH_SCAN = 10_000
# Rows per listing read while collecting the filtered memories (the API's largest page).
SCAN_PAGE = 500
CURSOR_PREFIX = "rk_"  # never the start of a memory id (ULIDs are upper-case base32)


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of a ranked search: its memories (best first), the token that continues
    after it (``None`` for an empty page), whether more follow, and why vectors were left
    out (``embedder_unavailable`` | ``embedder_timeout``, ``None`` when they were not)."""

    memories: list[Memory]
    next_after: str | None
    has_more: bool
    degraded: str | None = None


def page_token(position: int, memory_id: str) -> str:
    """The opaque cursor after the result at 0-based ``position``, memory ``memory_id``."""
    raw = f"{position + 1}:{memory_id}".encode()
    return CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def is_page_token(after: str | None) -> bool:
    """Whether ``after`` is a search's page token rather than a memory id."""
    return after is not None and after.startswith(CURSOR_PREFIX)


def _parse_token(after: str) -> tuple[int, str]:
    """(position to continue at, memory id) of a page token. Raises
    :class:`InvalidRequestError` (400, param ``after``) for a damaged one."""
    body = after[len(CURSOR_PREFIX):]
    try:
        text = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
        position, memory_id = text.split(":", 1)
        return int(position), memory_id
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequestError("after: not a cursor of this search; pass the last_id "
                                  "of the previous page.", param="after",
                                  code="invalid_value") from exc


def _start(ordered: list[Memory], after: str | None, offset: int) -> int:
    """Index of the first result of the page (``after`` then ``offset``)."""
    if after is None:
        return offset
    ids = [m.id for m in ordered]
    if is_page_token(after):
        position, memory_id = _parse_token(after)
        # Its memory gone (deleted, edited out of the results): one slot fewer before.
        start = ids.index(memory_id) + 1 if memory_id in ids else \
            min(max(0, position - 1), len(ids))
        return start + offset
    if after not in ids:
        raise InvalidRequestError("after: that memory is not among this search's results; "
                                  "pass the last_id of the previous page.", param="after",
                                  code="invalid_value")
    return ids.index(after) + 1 + offset


def admits(query: ListQuery, memory: Memory) -> bool:
    """Whether the listing of ``query`` (its filters; text, cursor and paging aside) shows
    the active ``memory`` that recall found: same owner and scope, category, source, and
    an ``enabled`` filter that is not ``False``."""
    owner = memory.user_id == query.user if query.scope == "personal" \
        else memory.user_id is None
    return (owner and memory.tenant == query.tenant and memory.scope == query.scope
            and query.category in (None, memory.category)
            and query.source in (None, memory.source) and query.enabled is not False)


async def inactive(store: MemoryStore, query: ListQuery) -> list[Memory]:
    """The retired and disabled memories the listing of ``query`` shows (recall never
    holds them), at most :data:`SEARCH_SCAN`: disabled ones unless ``enabled=true``;
    retired ones only with ``include_retired`` (then the listing of every state is read,
    the active memories dropped)."""
    if not query.include_disabled and not query.include_retired:
        return []
    if query.include_retired and query.enabled is not False:
        reads = [query]
    elif query.enabled is True or not query.include_disabled:
        return []
    else:
        reads = [replace(query, enabled=False)]
    out: list[Memory] = []
    for read in reads:
        after: str | None = None
        while len(out) < SEARCH_SCAN:
            page = await store.list_memories(replace(
                read, text=None, after=after, offset=0,
                limit=min(SCAN_PAGE, SEARCH_SCAN - len(out))))
            out.extend(m for m in page if not m.active)
            if len(page) < SCAN_PAGE:
                break
            after = page[-1].id
    return out


def word_hits(memories: list[Memory], text: str, *, best: float,
              first_rank: int) -> list[Candidate]:
    """Keyword candidates for memories outside the recall index (step 2 of the module
    docstring): ``best × share`` of the query words each contains, ranked from
    ``first_rank``."""
    words = [w.lower() for w in query_terms(text, limit=8, subwords=False)]
    if not words:
        return []
    scored = []
    for memory in memories:
        norm, title = normalize(memory.content), memory.title.lower()
        share = sum(1 for w in words if w in norm or w in title) / len(words)
        if share > 0:
            scored.append((share, memory))
    scored.sort(key=lambda pair: -pair[0])
    return [Candidate(memory, keyword_rank=first_rank + i, keyword_score=best * share)
            for i, (share, memory) in enumerate(scored)]


async def search(retriever: Retriever, store: MemoryStore, query: ListQuery, *,
                 now: datetime, embed_budget: float | None = None) -> SearchPage:
    """The page of ``query`` (``query.text`` set) in recall's order, best match first
    (see the module docstring). ``embed_budget``: seconds the query embedding may take
    (then keyword-only, ``degraded``). Raises :class:`InvalidRequestError` for an
    ``after`` that is neither a page token nor one of the results; store errors
    propagate."""
    text = query.text or ""
    if is_page_token(query.after):
        _parse_token(query.after or "")  # a damaged token is a 400 even with no results
    hits, degraded = await retriever.hits(
        tenant=query.tenant, user=query.user, text=text,
        include_shared=query.scope != "personal", keyword_limit=SEARCH_SCAN,
        embed_budget=embed_budget)
    found = [c for c in hits.candidates if c.memory.active and admits(query, c.memory)]
    best = max((c.keyword_score or 0.0 for c in found), default=0.0) or 1.0
    await load_segmenter_for(text)
    found += word_hits(await inactive(store, query), text, best=best,
                       first_rank=len(found) + 1)
    ranked = rank([QueryHits(found, vector=hits.vector)], now=now,
                  weights=retriever.weights, limit=len(found),
                  periods=mentioned_periods(text), distinct_only=False)
    ordered = [r.memory for r in ranked if r.relevance > 0]
    start = _start(ordered, query.after, query.offset)
    page = ordered[start:start + query.limit]
    token = page_token(start + len(page) - 1, page[-1].id) if page else None
    return SearchPage(page, token, start + len(page) < len(ordered), degraded)
