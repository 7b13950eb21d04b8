"""The benchmark user's memories and the questions it asks (deterministic).

500 distinct facts about one user, built from small vocabularies (preferences, work, tools,
places, people, routines), with evidence counts, quality scores and last-seen times spread
out, plus a profile — written through the store API (:class:`SqliteMemoryStore.add`,
``put_profile``) before the gateway starts. The questions use the same vocabulary, so
keyword recall finds candidates for every one of them.
"""

from __future__ import annotations

import importlib.util
import itertools
import random
from datetime import timedelta
from pathlib import Path

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.categories import Category
from proxy.memory.records import Memory, Profile, ScoredTag, new_id, utcnow

TENANT = "default"  # open mode: every caller is tenant "default"
USER = "bench-user"
MEMORIES = 500

_FOODS = ("ramen", "sourdough bread", "dark chocolate", "green tea", "espresso", "sushi",
          "tacos", "falafel", "pho", "kimchi", "paella", "dumplings", "oat milk", "mango")
_PLACES = ("Lisbon", "Kyoto", "Berlin", "Montreal", "Oslo", "Cape Town", "Seoul", "Porto",
           "Vancouver", "Edinburgh", "Taipei", "Valencia", "Melbourne", "Prague")
_TOOLS = ("Neovim", "PostgreSQL", "Kubernetes", "Terraform", "Rust", "TypeScript", "Django",
          "FastAPI", "Grafana", "Redis", "Kafka", "Svelte", "Figma", "Obsidian", "Jupyter")
_TASKS = ("data pipelines", "code review", "incident response", "API design", "load testing",
          "note taking", "dashboards", "database migrations", "frontend prototypes",
          "release planning", "onboarding docs", "cost reports")
_HOBBIES = ("bouldering", "trail running", "film photography", "chess", "sailing",
            "woodworking", "cycling", "jazz piano", "birdwatching", "pottery", "kayaking",
            "sketching", "gardening", "swimming")
_PEOPLE = (("sister", "Ana"), ("partner", "Sam"), ("manager", "Priya"), ("friend", "Tomas"),
           ("mentor", "Grace"), ("colleague", "Wei"), ("brother", "Luca"), ("neighbour", "Ines"),
           ("daughter", "Maya"), ("son", "Leo"), ("teammate", "Jonas"), ("cousin", "Nora"))
_TIMES = ("early mornings", "late evenings", "weekends", "lunch breaks", "Friday afternoons",
          "Monday mornings", "long flights", "rainy days")
_TEMPLATES: tuple[tuple[Category, str, str], ...] = (
    ("user_preference", "likes {food} and orders it in {place}", "food"),
    ("user_preference", "prefers {tool} for {task}", "tools"),
    ("user_preference", "does {hobby} on {time}", "hobby"),
    ("user_preference", "wants answers about {task} kept short, with {tool} examples", "style"),
    ("technical", "maintains {task} built on {tool} at work", "stack"),
    ("technical", "hit a {tool} problem during {task} last quarter", "issue"),
    ("organizational", "reviews {task} with their {relation} {name}", "team"),
    ("organizational", "owns {task} for the team in {place}", "role"),
    ("domain", "is planning a trip to {place} for {hobby}", "travel"),
    ("domain", "their {relation} {name} lives in {place} and loves {food}", "family"),
    ("business", "budgets {task} costs every quarter using {tool}", "process"),
    ("user_preference", "avoids {food} during {time}", "food"),
)


def build_memories(count: int = MEMORIES, *, seed: int = 5) -> list[Memory]:
    """``count`` distinct, active memories of :data:`USER`."""
    rng = random.Random(seed)
    now = utcnow()
    seen: set[str] = set()
    out: list[Memory] = []
    for attempt in itertools.count():
        if len(out) >= count:
            break
        if attempt > count * 50:
            raise RuntimeError("could not build enough distinct memories")
        category, template, tag = rng.choice(_TEMPLATES)
        relation, name = rng.choice(_PEOPLE)
        content = "User " + template.format(
            food=rng.choice(_FOODS), place=rng.choice(_PLACES), tool=rng.choice(_TOOLS),
            task=rng.choice(_TASKS), hobby=rng.choice(_HOBBIES), time=rng.choice(_TIMES),
            relation=relation, name=name,
        ) + "."
        if content in seen:
            continue
        seen.add(content)
        seen_at = now - timedelta(days=rng.uniform(0, 200))
        out.append(Memory(
            id=new_id(), tenant=TENANT, user_id=USER, content=content,
            title=content.removeprefix("User ")[:30], category=category, subcategory=tag,
            tags=(tag,), source="auto", source_channel="private",
            score=round(rng.uniform(0.5, 0.95), 2), hits=rng.choice((1, 1, 1, 2, 2, 3, 5, 8)),
            created_at=seen_at - timedelta(days=rng.uniform(0, 30)), updated_at=seen_at,
            last_seen_at=seen_at,
        ))
    return out


def build_profile() -> Profile:
    now = utcnow()
    return Profile(
        tenant=TENANT, user_id=USER, names=("Alex",), first_seen=now - timedelta(days=300),
        last_seen=now, message_count=1200, style="concise, technical, likes examples",
        impression="a backend engineer who travels often",
        traits=tuple(ScoredTag(t, 0.8, 5, now) for t in ("curious", "pragmatic", "direct")),
        topics=tuple(ScoredTag(t, 0.7, 4, now) for t in ("databases", "travel", "food")),
    )


def questions(count: int = 48, *, seed: int = 7) -> list[str]:
    """User questions that share words with the memories (so recall finds candidates)."""
    rng = random.Random(seed)
    shapes = (
        "Which {tool} setup would you suggest for our {task}?",
        "I'm heading to {place} soon, any tips for {hobby} there?",
        "Can you recommend a good place for {food} in {place}?",
        "How should I structure {task} so my {relation} can review it?",
        "What's a quick way to debug {tool} during {task}?",
        "Plan a relaxed weekend of {hobby} for me.",
    )
    out = []
    for _ in range(count):
        relation, _name = rng.choice(_PEOPLE)
        out.append(rng.choice(shapes).format(
            tool=rng.choice(_TOOLS), task=rng.choice(_TASKS), place=rng.choice(_PLACES),
            hobby=rng.choice(_HOBBIES), food=rng.choice(_FOODS), relation=relation,
        ))
    return out


async def seed_store(path: Path, *, count: int = MEMORIES, embed: str | None = None,
                     cache_dir: Path | None = None) -> int:
    """Create the database at ``path`` with :data:`USER`'s memories and profile.

    ``embed`` (``local`` | ``static``): each memory also carries its vector of ``content``
    (what the gateway's writers embed) and the model id, computed here with the embedder
    the gateway loads, so hybrid recall has a vector for every memory. ``local`` needs the
    ``embeddings`` extra, ``static`` the ``static`` one (``cache_dir``: where its distilled
    model is, or is made)."""
    memories = build_memories(count)
    if embed:
        memories = await _with_vectors(memories, embed, cache_dir)
    async with SqliteDatabase(path) as db:
        store = SqliteMemoryStore(db)
        for memory in memories:
            await store.add(memory)
        await store.put_profile(build_profile())
        counts = await store.count(TENANT, USER)
    return counts["total"]


async def _with_vectors(memories: list[Memory], provider: str,
                        cache_dir: Path | None) -> list[Memory]:
    from proxy.memory.embedders import build_embedder
    from proxy.settings import EmbedderSettings

    embedder = build_embedder(EmbedderSettings(
        provider=provider, model="all-MiniLM-L6-v2", batch_size=64, cache_size=0,  # type: ignore[arg-type]
        **({"cache_dir": cache_dir} if cache_dir is not None else {})))
    assert embedder is not None
    await embedder.start()
    try:
        vectors = (await embedder.embed_documents([m.content for m in memories])).vectors
    finally:
        await embedder.aclose()
    return [m.with_changes(embedding=v, embedding_model=embedder.model)
            for m, v in zip(memories, vectors, strict=True)]


def can_embed() -> bool:
    """Whether the ``local`` embedder can load here (the ``embeddings`` extra)."""
    from proxy.memory.embed_local import bundled_model_dir

    return (importlib.util.find_spec("sentence_transformers") is not None
            and bundled_model_dir() is not None)
