"""Images users share: tiered by a vision-capable learning model, skipped otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.memory.store import ListQuery
from tests.fakes import FakeUpstream, make_settings, running_gateway

PHOTO = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
MEME = "https://example.invalid/meme.png"


def settings(tmp_path: Path, *, vision: bool) -> Any:
    return make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1},
                         model_list=[{"model_name": "m", "litellm_params": {
                             "model": "openai/up-model", "api_base": "http://upstream.test/v1",
                             "api_key": "sk-x"}, "model_info": {"supports_vision": vision}}])


async def share(tmp_path: Path, upstream: FakeUpstream, *, vision: bool) -> list[Any]:
    async with running_gateway(settings(tmp_path, vision=vision), upstream) as gateway:
        async with gateway.client() as client:
            response = await client.post("/v1/chat/completions", headers={"X-User-Id": "u"},
                                         json={"model": "m", "messages": [{
                                             "role": "user", "content": [
                                                 {"type": "text", "text": "Me at the beach, "
                                                  "and a funny meme."},
                                                 {"type": "image_url", "image_url": {"url": PHOTO}},
                                                 {"type": "image_url", "image_url": {"url": MEME}},
                                             ]}]})
        assert response.status_code == 200
        await gateway.settle()
        return await gateway.res.store.list_memories(ListQuery(tenant="default", user="u"))


async def test_vision_model_tiers_images(tmp_path: Path) -> None:
    """With a vision learning model, images go to the extraction call as image parts; a
    ``person`` verdict becomes a memory about the user, ``skip`` does not."""
    upstream = FakeUpstream()
    upstream.extract = lambda body: {"memories": [], "images": [
        {"image": 1, "tier": "person", "memory": "Wears round glasses"},
        {"image": 2, "tier": "skip", "memory": None}]}
    stored = await share(tmp_path, upstream, vision=True)
    assert [(m.content, m.subcategory, m.tags) for m in stored] == [
        ("Wears round glasses", "appearance", ("image",))]
    extract = next(body for kind, body in upstream.learning_calls if kind == "extract")
    parts = extract["messages"][1]["content"]
    assert [p["image_url"]["url"] for p in parts if p["type"] == "image_url"] == [PHOTO, MEME]
    assert "[image 1] [image 2]" in parts[0]["text"]
    assert '"images"' in extract["messages"][0]["content"]


async def test_images_are_skipped_without_vision(tmp_path: Path) -> None:
    """Without vision the model gets text only, and the skip is recorded."""
    upstream = FakeUpstream()
    upstream.extract = lambda body: {"memories": [], "images": [
        {"image": 1, "tier": "person", "memory": "Wears round glasses"}]}
    assert await share(tmp_path, upstream, vision=False) == []
    extract = next(body for kind, body in upstream.learning_calls if kind == "extract")
    assert isinstance(extract["messages"][1]["content"], str)
    assert "data:image" not in str(extract)
