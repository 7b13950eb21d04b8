"""Learning-model calls: structured output when supported, fallback when refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fakes import FakeUpstream, Reply, make_settings, running_gateway


def _settings(tmp_path: Path, **model_info: Any) -> Any:
    return make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1},
                         model_list=[{"model_name": "m", "litellm_params": {
                             "model": "openai/up-model", "api_base": "http://upstream.test/v1",
                             "api_key": "sk-x"}, "model_info": model_info}])


async def _one_turn(tmp_path: Path, upstream: FakeUpstream, *learning_replies: Reply,
                    **model_info: Any) -> None:
    async with running_gateway(_settings(tmp_path, **model_info), upstream) as gateway:
        async with gateway.client() as client:
            await client.post("/v1/chat/completions", headers={"X-User-Id": "u"}, json={
                "model": "m", "messages": [{"role": "user", "content": "I brew beer."}]})
        upstream.push(*learning_replies)
        await gateway.settle()


async def test_json_schema_when_the_model_supports_it(tmp_path: Path) -> None:
    """Models with structured output get ``response_format: json_schema`` for both calls."""
    upstream = FakeUpstream()
    await _one_turn(tmp_path, upstream, supports_response_schema=True)
    formats = [body["response_format"] for _, body in upstream.learning_calls]
    assert [f["type"] for f in formats] == ["json_schema", "json_schema"]
    assert [f["json_schema"]["name"] for f in formats] == ["score", "extract"]
    assert "memories" in formats[1]["json_schema"]["schema"]["properties"]


async def test_json_mode_with_schema_otherwise(tmp_path: Path) -> None:
    """Models without it get JSON mode carrying the schema (llama.cpp's grammar extension)."""
    upstream = FakeUpstream()
    await _one_turn(tmp_path, upstream, supports_response_schema=False)
    formats = [body["response_format"] for _, body in upstream.learning_calls]
    assert [f["type"] for f in formats] == ["json_object", "json_object"]
    assert "dimensions" in formats[0]["schema"]["properties"]
    assert "memories" in formats[1]["schema"]["properties"]


async def test_upstream_refusing_response_format_is_asked_without_it(tmp_path: Path) -> None:
    """A 400 about response_format makes the gateway retry without it, and not send it
    again to that model."""
    upstream = FakeUpstream()
    await _one_turn(tmp_path, upstream, Reply(status=400, json={"error": {
        "message": "response_format is not supported by this model",
        "type": "invalid_request_error"}}))
    calls = [body.get("response_format") for _, body in upstream.learning_calls]
    assert calls[0] is not None
    assert "schema" in calls[0]
    assert calls[1:] == [{"type": "json_object"}, {"type": "json_object"}]
    assert [kind for kind, _ in upstream.learning_calls] == ["score", "score", "extract"]


async def test_server_error_about_json_schema_falls_back_to_json_mode(tmp_path: Path) -> None:
    """llama-cpp-python answers 500 to an unknown ``json_schema`` format: the gateway falls
    back to JSON mode, not to no format at all."""
    upstream = FakeUpstream()
    await _one_turn(tmp_path, upstream, Reply(status=500, json={"error": {
        "message": "1 validation error: response_format.type: Input should be 'text' or "
                   "'json_object'", "type": "server_error"}}), supports_response_schema=True)
    formats = [body.get("response_format", {}).get("type") for _, body in upstream.learning_calls]
    assert formats == ["json_schema", "json_object", "json_object"]
    with_schema = [body["response_format"] for _, body in upstream.learning_calls]
    assert all("schema" in f for f in with_schema[1:])


async def test_rate_limit_is_not_mistaken_for_a_format_refusal(tmp_path: Path) -> None:
    """A 429 is retried later by the worker, with the same format."""
    upstream = FakeUpstream()
    await _one_turn(tmp_path, upstream, Reply(status=429, json={"error": {
        "message": "Rate limit reached for json_object requests",
        "type": "rate_limit_error"}}, headers={"retry-after": "0"}))
    formats = [body.get("response_format", {}).get("type") for _, body in upstream.learning_calls]
    assert formats[0] == "json_object"
    assert "json_object" in formats[1:]


def _window_settings(tmp_path: Path, window: int, **learning: Any) -> Any:
    return make_settings(
        tmp_path, model_list=[
            {"model_name": "m", "litellm_params": {"model": "openai/up-model",
                                                   "api_base": "http://upstream.test/v1",
                                                   "api_key": "sk-upstream"},
             "model_info": {"max_input_tokens": 64000}},
            {"model_name": "tiny", "litellm_params": {"model": "openai/tiny",
                                                      "api_base": "http://upstream.test/v1",
                                                      "api_key": "sk-upstream"},
             "model_info": {"max_input_tokens": window}}],
        learning={"enabled": True, **learning})


def test_a_learning_window_too_small_for_any_transcript_is_a_startup_error(
    tmp_path: Path
) -> None:
    """learning.model with a window the prompt and the reply fill stops startup with a
    message naming the setting; so does a model_list entry when learning.model is empty."""
    import pytest

    from proxy.resources import preflight
    from proxy.settings import ConfigError

    with pytest.raises(ConfigError, match=r"^learning\.model: the model 'tiny'.*"
                                          r"learning\.max_output_tokens"):
        preflight(_window_settings(tmp_path, 2400, model="tiny"))
    with pytest.raises(ConfigError, match=r"^model_list \('tiny'"):
        preflight(_window_settings(tmp_path, 2400))


async def test_a_window_with_room_starts_and_lowering_the_reply_makes_room(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """The same small model starts with a smaller learning.max_output_tokens, and a
    gateway with learning off never checks."""
    from proxy.resources import preflight

    preflight(_window_settings(tmp_path, 2400, model="tiny", max_output_tokens=512))
    off = make_settings(tmp_path, model_list=_window_settings(tmp_path, 900).model_dump(
        )["model_list"], learning={"enabled": False})
    preflight(off)
    async with running_gateway(_window_settings(tmp_path, 2400, model="tiny",
                                                max_output_tokens=512), upstream):
        pass


def test_the_shipped_config_starts_with_its_local_model() -> None:
    """config.yaml as shipped (learning on, the ``local`` model of 4,096 tokens) passes the
    startup check."""
    from proxy.learning.model import check_window
    from proxy.models import ModelRegistry
    from proxy.settings import load_settings
    from proxy.tokens import TokenCounter

    settings = load_settings(Path(__file__).resolve().parents[2] / "config.yaml")
    assert settings.learning.enabled
    assert any(d.model_name == "local" and d.model_info.max_input_tokens == 4096
               for d in settings.model_list)
    check_window(settings.learning, ModelRegistry(settings), TokenCounter())
