"""``memory.embedder`` settings, the provider factory, and the litellm provider (its HTTP
contract mocked with respx, as for the chat upstream)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from proxy.memory.embed import EmbedderError
from proxy.memory.embedders import build_embedder
from proxy.settings import ConfigError, EmbedderSettings, load_settings

ROOT = Path(__file__).resolve().parent.parent.parent
EMBED_URL = "http://embed.test/v1/embeddings"


def test_default_is_keyword_only() -> None:
    """Out of the box there is no embedder: ``provider: none``."""
    settings = load_settings(use_file=False)
    assert settings.memory.embedder.provider == "none"
    assert build_embedder(settings.memory.embedder) is None


@pytest.mark.parametrize(("embedder", "named"), [
    ({"provider": "litellm"}, "memory.embedder.model is required"),
    ({"provider": "openai", "model": "x"}, "memory.embedder.provider"),
    ({"provider": "local", "dimension": 0}, "memory.embedder.dimension"),
    ({"provider": "local", "batch_size": 0}, "memory.embedder.batch_size"),
    ({"provider": "litellm", "model": "m", "api_key": "os.environ/NOT_SET_ANYWHERE_42"},
     "NOT_SET_ANYWHERE_42 named by memory.embedder.api_key is not set"),
])
def test_invalid_embedder_settings_name_the_setting(embedder: dict[str, Any],
                                                     named: str) -> None:
    """Bad ``memory.embedder`` values fail at load with the setting named."""
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_settings(use_file=False, memory={"embedder": embedder})


def test_api_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``api_key: os.environ/NAME`` resolves to the variable's value."""
    monkeypatch.setenv("EMBED_KEY", "sk-embed")
    settings = load_settings(use_file=False, memory={"embedder": {
        "provider": "litellm", "model": "text-embedding-3-small",
        "api_key": "os.environ/EMBED_KEY"}})
    key = settings.memory.embedder.api_key
    assert key is not None
    assert key.get_secret_value() == "sk-embed"


def test_keyword_only_startup_imports_no_model_library(tmp_path: Path) -> None:
    """With ``provider: none`` opening every resource imports neither torch,
    sentence-transformers, transformers nor litellm (startup stays fast)."""
    script = f"""
import asyncio, json, sys
from proxy.settings import load_settings
from proxy.resources import open_resources
from proxy.app import create_app

async def main():
    settings = load_settings(use_file=False, storage={{"path": {str(tmp_path / 'm.db')!r}}})
    create_app(settings)
    async with open_resources(settings):
        pass
    heavy = ("torch", "sentence_transformers", "transformers", "litellm")
    print(json.dumps([m for m in heavy if m in sys.modules]))

asyncio.run(main())
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, timeout=60, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def embeddings_body(*rows: list[float], tokens: int = 5) -> dict[str, Any]:
    # Out of order on purpose: litellm passes the provider's "index" through.
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    return {"object": "list", "data": list(reversed(data)), "model": "text-embedding-3-small",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def litellm_settings(**extra: Any) -> EmbedderSettings:
    return EmbedderSettings(provider="litellm", model="openai/text-embedding-3-small",
                            api_base="http://embed.test/v1", api_key="sk-embed", **extra)


async def test_litellm_provider_embeds_in_order_and_reports_tokens() -> None:
    """Vectors come back in input order (by ``index``), normalised, with the provider's
    token count; the key goes in the Authorization header; the probe sets the dimension."""
    embedder = build_embedder(litellm_settings())
    assert embedder is not None
    with respx.mock(assert_all_called=True) as mock:
        route = mock.post(EMBED_URL).mock(side_effect=[
            httpx.Response(200, json=embeddings_body([0.0, 3.0, 4.0])),
            httpx.Response(200, json=embeddings_body([2.0, 0.0, 0.0], [0.0, 0.0, 5.0],
                                                     tokens=9)),
        ])
        await embedder.start()
        assert embedder.dimension == 3
        result = await embedder.embed_documents(["first", "second"])
        request = route.calls.last.request
    assert result.vectors == ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0))
    assert result.tokens == 9
    assert json.loads(request.content)["input"] == ["first", "second"]
    assert request.headers["authorization"] == "Bearer sk-embed"


async def test_litellm_provider_errors_become_embedder_errors() -> None:
    """A provider error (here 401) raises EmbedderError with the provider's message."""
    embedder = build_embedder(litellm_settings(dimension=3))
    assert embedder is not None
    with respx.mock() as mock:
        mock.post(EMBED_URL).mock(return_value=httpx.Response(
            401, json={"error": {"message": "Incorrect API key provided",
                                 "type": "invalid_request_error"}}))
        await embedder.start()  # the failed probe is logged, not raised
        with pytest.raises(EmbedderError, match="Incorrect API key"):
            await embedder.embed_query("hello")


async def test_litellm_dimension_mismatch_fails_startup() -> None:
    """A configured dimension the provider does not return is a startup error."""
    embedder = build_embedder(litellm_settings(dimension=1536))
    assert embedder is not None
    with respx.mock() as mock:
        mock.post(EMBED_URL).mock(return_value=httpx.Response(
            200, json=embeddings_body([0.0, 3.0, 4.0])))
        with pytest.raises(ConfigError, match=r"dimension is 1536 .* returns 3"):
            await embedder.start()
