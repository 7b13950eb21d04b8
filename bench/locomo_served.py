"""The served mode of ``bench/retrieval_locomo.py`` (``--served``): LoCoMo's memories
written as learning writes them and recalled as a chat request recalls them.

The held-out protocol loads each conversation's observations in one write with ids of its
own and ranks with query vectors computed beforehand. Here, per conversation, a fresh
SQLite store receives one learning change set per session, oldest first — what
:mod:`proxy.learning.consolidate` builds for new facts and the pipeline commits
(:meth:`~proxy.memory.store.MemoryStore.apply`): ULID ids, ``source: auto``, the
extraction parser's title for a fact without one (:func:`~proxy.memory.titles.short_title`
of its content: up to 30 characters, cut at a word boundary), hits 1 with
one evidence pair per batch, the session as ``source_conversation_id``, the session date
as created / last seen / learned-from, a conversation record and ``created`` audit
events, vectors from ``embed_documents`` with the embedder's model id. Each question is
then recalled by a :class:`~proxy.memory.retrieve.Retriever` wired as
:class:`~proxy.memory.service.MemoryService` wires it (shipped ``memory`` settings and
ranking weights; the query plan, dates and query embedding of a chat request, the query
embedded by the embedder itself, no deadline). The figures use the shipped weights, so
they compare with the protocol's ``defaults, all conversations`` row.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.embed import CachedEmbedder
from proxy.memory.records import ConversationRecord, Memory, new_id
from proxy.memory.retrieve import Retriever, plan_queries
from proxy.memory.service import rank_weights
from proxy.memory.store import AuditEvent, ChangeSet
from proxy.memory.titles import short_title
from proxy.memory.when import mentioned_periods
from proxy.settings import MemorySettings


def learned(memory: Memory, *, vector: Sequence[float] | None, model: str | None,
            titled: bool = True) -> Memory:
    """``memory`` (an observation) as learning stores a new fact of that session
    (``titled=False``: with no title, as the held-out protocol stores it)."""
    return memory.with_changes(
        id=new_id(), title=short_title(memory.content) if titled else "",
        subject="user", source="auto",
        hits=1, embedding=None if vector is None else tuple(vector),
        embedding_model=None if vector is None else model)


async def write_sessions(store: SqliteMemoryStore, conv: Any,
                         embedder: CachedEmbedder | None, *,
                         titled: bool = True) -> dict[str, str]:
    """One learning change set per session of ``conv``, oldest first; returns the
    observation id → stored memory id."""
    sessions: dict[str, list[Memory]] = defaultdict(list)
    for memory in conv.memories:
        sessions[memory.source_conversation_id or ""].append(memory)
    ids: dict[str, str] = {}
    for session, memories in sorted(sessions.items(), key=lambda s: s[1][0].created_at):
        when = memories[0].created_at
        key = f"{conv.id}:{session}:learn"
        vectors: Sequence[Sequence[float] | None] = [None] * len(memories)
        if embedder is not None:
            vectors = (await embedder.embed_documents([m.content for m in memories])).vectors
        stored = [learned(m, vector=v, model=None if embedder is None else embedder.model,
                          titled=titled)
                  for m, v in zip(memories, vectors, strict=True)]
        ids.update((m.id, s.id) for m, s in zip(memories, stored, strict=True))
        await store.apply(ChangeSet(
            tenant=memories[0].tenant, user_id=conv.id, batch_key=key,
            upserts=tuple(stored), evidence=tuple((s.id, key) for s in stored),
            conversation=ConversationRecord(
                tenant=memories[0].tenant, user_id=conv.id, conversation_id=session,
                score=stored[0].score, learned_messages=len(stored), updated_at=when),
            audit=tuple(AuditEvent(tenant=s.tenant, user_id=conv.id, action="created",
                                   actor="auto", at=when, conversation_id=session,
                                   memory_id=s.id) for s in stored),
            learned_from=when))
    return ids


async def served(conversations: Sequence[Any], embedder: CachedEmbedder | None, *,
                 scores: Callable[[], Any], top: int, titled: bool = True) -> Any:
    """Scores (the protocol's :class:`Scores`, from ``scores()``) of every question of
    ``conversations`` in the served mode (module docstring), ``top`` memories a recall;
    ``titled=False`` stores the facts without a title."""
    settings = MemorySettings()
    out = scores()
    with tempfile.TemporaryDirectory() as tmp:
        async with SqliteDatabase(Path(tmp) / "served.db") as db:
            store = SqliteMemoryStore(db)  # every conversation's user in one store
            ids = {k: v for conv in conversations
                   for k, v in (await write_sessions(store, conv, embedder,
                                                   titled=titled)).items()}
            retriever = Retriever(store=store, embedder=embedder,
                                  weights=rank_weights(settings),
                                  candidate_pool=settings.candidate_pool)
            for conv in conversations:
                for q in conv.questions:
                    queries = plan_queries(
                        [{"role": "user", "content": q.text}],
                        context_turns=settings.query_context_turns,
                        max_subqueries=settings.max_subqueries,
                        subquery_weight=settings.subquery_weight)
                    result = await retriever.recall(
                        tenant=conv.memories[0].tenant, user=conv.id, queries=queries,
                        limit=top, now=conv.now, periods=mentioned_periods(q.text))
                    out.add(q.category, [r.memory.id for r in result.ranked],
                            frozenset(ids[m] for m in q.relevant))
    return out


def compare(name: str, served_scores: Any, protocol: Any, categories: dict[int, str]) -> float:
    """Print the served figures beside the protocol's shipped-weights figures (r@5 per
    category and all, r@10, hit@5, MRR); returns the served r@5 of all questions."""
    print(f"\n== {name}: the product as it serves (shipped weights, all conversations)")
    print(f"{'':<34}" + "".join(f"{'r@5 ' + c[:9]:>16}" for c in categories.values())
          + f"{'r@5':>8}{'r@10':>8}{'hit@5':>8}{'MRR':>8}")
    for title, scores in (("protocol, shipped weights", protocol), ("served", served_scores)):
        print(f"{title:<34}" + "".join(f"{scores.mean(c)[0]:>16.3f}" for c in categories)
              + "".join(f"{v:>8.3f}" for v in scores.mean()))
    before, after = protocol.mean()[0], served_scores.mean()[0]
    print(f"  served − protocol r@5: {after - before:+.3f} "
          f"({'within 0.005 or better' if after >= before - 0.005 else 'WORSE by > 0.005'})")
    return after
