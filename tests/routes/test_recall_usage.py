"""The embedding cost of recall (``recall_tokens``) shows in every usage view — the
usage report and the daily statistics — beside memory and learning tokens and in neither
of them, on both backends."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from proxy.memory.embed import CachedEmbedder
from tests.fakes import (
    ConceptBackend,
    FakeUpstream,
    backend_overrides,
    make_settings,
    running_gateway,
)
from tests.routes.test_memory_embeddings import CONCEPTS, ask, remember

ADMIN = {"Authorization": "Bearer admin-a"}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def test_recall_tokens_show_in_the_usage_report_and_the_daily_figures(
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    upstream: FakeUpstream,
) -> None:
    """A remote embedder bills 5 tokens for a question's embedding: the asker's usage
    entry (and the model's and the day's) says ``recall_tokens: 5`` while the user and
    learning tokens stay as they were; a repeated question (cached vector) adds nothing,
    and a user who asked nothing has 0."""
    monkeypatch.setenv("K_ADMIN", "admin-a")
    chosen = SimpleNamespace(param=backend, getfixturevalue=request.getfixturevalue)
    settings = make_settings(
        tmp_path,
        auth={"admin_keys": [{"key": "os.environ/K_ADMIN", "tenant": "default"}]},
        **backend_overrides(chosen, tmp_path),
    )
    embedder = CachedEmbedder(ConceptBackend(CONCEPTS, tokens_per_text=5))
    async with running_gateway(settings, upstream, embedder=embedder) as gw:
        await remember(gw, "Owns a puppy called Rex")
        await remember(gw, "Is allergic to cats", user="u2")
        await ask(gw, "What about my hound?")
        await ask(gw, "What about my hound?")
        async with gw.client(headers=ADMIN) as client:
            by_user = (await client.get("/v1/admin/usage", params={"group_by": "user"})).json()[
                "data"
            ]
            by_model = (await client.get("/v1/admin/usage", params={"group_by": "model"})).json()[
                "data"
            ]
            stats = (await client.get("/v1/admin/stats", params={"days": 1})).json()
    rows = {r["key"]: r for r in by_user}
    assert rows["u1"]["recall_tokens"] == 5
    assert rows["u1"]["requests"] == 2
    assert rows["u1"]["user_tokens"] == {"prompt": 24, "completion": 6}  # upstream's figures
    assert rows["u1"]["learning_tokens"]["embed"] == 5  # the manual memory, not the questions
    assert rows.get("u2", {"recall_tokens": 0})["recall_tokens"] == 0
    assert [(r["key"], r["recall_tokens"]) for r in by_model] == [("fake-concepts", 0), ("m", 5)]
    [today] = stats["daily"]
    assert today["recall_tokens"] == 5
    assert today["user_tokens"] == 30
