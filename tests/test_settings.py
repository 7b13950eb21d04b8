"""Configuration: YAML + environment + defaults, secrets from the environment only."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import main
from proxy.settings import ConfigError, load_settings

ROOT = Path(__file__).resolve().parent.parent


def test_code_defaults_are_the_product_defaults() -> None:
    """Code defaults are the product's: learning off, 0.6 threshold, 5/25 batches, top-5, 10 %."""
    settings = load_settings(use_file=False)
    assert settings.learning.enabled is False
    assert settings.learning.score_threshold == 0.6
    assert settings.learning.batch_messages == {"private": 5, "group": 25}
    assert settings.learning.max_memory_per_user == 500
    assert settings.learning.retention_days == 365
    assert settings.learning.dedup_similarity == 0.85
    assert settings.memory.injection_count == 5
    assert settings.memory.token_budget_percent == 10
    assert settings.storage.backend == "sqlite"


def test_shipped_config_loads_and_turns_learning_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository's config.yaml is valid and enables learning explicitly."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    settings = load_settings(ROOT / "config.yaml")
    assert settings.learning.enabled is True
    assert [d.model_name for d in settings.model_list] == ["gpt-4o-mini", "local"]
    first = settings.model_list[0].litellm_params
    assert first.api_key is None
    assert first.missing_api_key_env == "OPENAI_API_KEY"


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MEMORY_PROXY_* variables with "__" nesting override YAML values."""
    config = tmp_path / "c.yaml"
    config.write_text("learning:\n  enabled: false\n  batch_messages: 3\nserver:\n  port: 1\n")
    monkeypatch.setenv("MEMORY_PROXY_LEARNING__ENABLED", "true")
    monkeypatch.setenv("MEMORY_PROXY_SERVER__PORT", "9999")
    settings = load_settings(config)
    assert settings.learning.enabled is True
    assert settings.server.port == 9999
    assert settings.learning.batch_messages == {"private": 3, "group": 3}


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MEMORY_PROXY_CONFIG picks the file."""
    config = tmp_path / "other.yaml"
    config.write_text("memory:\n  injection_count: 9\n")
    monkeypatch.setenv("MEMORY_PROXY_CONFIG", str(config))
    assert load_settings().memory.injection_count == 9


def test_upstream_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.environ/NAME`` in litellm_params resolves to the variable's value."""
    monkeypatch.setenv("MY_UPSTREAM_KEY", "sk-real")
    settings = load_settings(use_file=False, model_list=[{
        "model_name": "m", "litellm_params": {"model": "openai/x",
                                              "api_key": "os.environ/MY_UPSTREAM_KEY"}}])
    key = settings.model_list[0].litellm_params.api_key
    assert key is not None
    assert key.get_secret_value() == "sk-real"


@pytest.mark.parametrize(("yaml_text", "named"), [
    ("learning:\n  score_threshold: 2\n", "learning.score_threshold"),
    ("learning:\n  batch_messages: {private: 0}\n", "learning.batch_messages"),
    ("memory:\n  position: middle\n", "memory.position"),
    ("storage:\n  backend: mongo\n", "storage.backend"),
    ("storage:\n  backend: redis\n", "storage.url"),
    ("storage:\n  url: redis://localhost:6379/0\n", "storage.url"),
    ("storage:\n  backend: redis\n  url: http://localhost:6379\n", "storage.url"),
    ("storage:\n  backend: redis\n  url: redis://h:6379/0?protocol=3\n", "storage.url"),
    ("storage:\n  backend: redis\n  url: os.environ/NOT_SET_ANYWHERE\n", "storage.url"),
    ("storage:\n  key_prefix: 'a{b}'\n", "storage.key_prefix"),
    ("storage:\n  vector_dim: 0\n", "storage.vector_dim"),
    ("auth:\n  keys: [{key: plain-secret, tenant: t}]\n", "auth.keys.0"),
    ("auth:\n  keys: [{key: os.environ/NOT_SET_ANYWHERE, tenant: t}]\n", "auth.keys.0"),
    ("auth:\n  keys: [{key_sha256: abc, tenant: t}]\n", "auth.keys.0"),
    ("surprise: 1\n", "surprise"),
    ("model_list: [{model_name: m}]\n", "model_list.0.litellm_params"),
    ("learning:\n  model: nope\nmodel_list: [{model_name: m, litellm_params: {model: x}}]\n",
     "learning.model"),
    ("model_list: [{model_name: m, litellm_params: {model: openai/x, api_base: not a url}}]\n",
     "model_list.0.litellm_params.api_base"),
    ("model_list: [{model_name: m, litellm_params: {model: openai/x, "
     "api_base: 'ftp://127.0.0.1:8081/v1'}}]\n", "model_list.0.litellm_params.api_base"),
])
def test_invalid_config_names_the_setting(tmp_path: Path, yaml_text: str, named: str) -> None:
    """Invalid configuration fails at load with a message naming the setting."""
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_settings(config)


def test_redis_storage_takes_its_url_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``storage.url: os.environ/NAME`` resolves like other secrets and stays a
    SecretStr."""
    monkeypatch.setenv("MY_REDIS_URL", "redis://:pw@localhost:6379/2")
    settings = load_settings(use_file=False, storage={
        "backend": "redis", "url": "os.environ/MY_REDIS_URL", "key_prefix": "prod",
        "vector_dim": 384, "path": str(tmp_path / "gw.db")})
    storage = settings.storage
    assert storage.url is not None
    assert storage.url.get_secret_value() == "redis://:pw@localhost:6379/2"
    assert "pw" not in repr(storage)
    assert (storage.key_prefix, storage.vector_dim) == ("prod", 384)


def test_redis_url_can_come_from_a_prefixed_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """MEMORY_PROXY_STORAGE__* variables configure the Redis backend."""
    monkeypatch.setenv("MEMORY_PROXY_STORAGE__BACKEND", "redis")
    monkeypatch.setenv("MEMORY_PROXY_STORAGE__URL", "rediss://cache.internal:6380/0")
    settings = load_settings(use_file=False)
    assert settings.storage.backend == "redis"
    assert settings.storage.vector_dim is None


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    """An explicitly named file that does not exist is reported."""
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "absent.yaml")


def test_cli_reports_bad_config_and_exits_2(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``memory-proxy serve`` with a bad config prints the setting and exits with 2."""
    config = tmp_path / "bad.yaml"
    config.write_text("memory:\n  injection_count: -1\n")
    assert main(["serve", "--config", str(config)]) == 2
    assert "memory.injection_count" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ("a: [1,\n  b: c: d\n", "not valid YAML"),
])
def test_broken_yaml_is_a_config_error(tmp_path: Path, text: str, message: str) -> None:
    """A file that is not YAML is reported as such, without a stack trace."""
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


def test_bad_json_in_the_environment_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list given as broken JSON in an environment variable names the setting."""
    monkeypatch.setenv("MEMORY_PROXY_MODEL_LIST", "[{bad json")
    with pytest.raises(ConfigError, match="model_list"):
        load_settings(use_file=False)


def test_unusable_storage_path_is_reported_before_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``serve`` with a database path it cannot create exits 2 naming storage.path."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    config = tmp_path / "c.yaml"
    config.write_text(f"storage: {{path: '{blocker / 'sub' / 'db.sqlite'}'}}\n")
    assert main(["serve", "--config", str(config)]) == 2
    assert "storage.path" in capsys.readouterr().err


def test_a_literal_upstream_key_is_flagged_and_an_env_reference_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets belong in the environment: a key written out in model_list is marked, and
    the gateway warns about it at startup (``upstream_key_literal``)."""
    monkeypatch.setenv("SOME_UPSTREAM_KEY", "sk-from-env")
    settings = load_settings(use_file=False, model_list=[
        {"model_name": "a", "litellm_params": {"model": "openai/x", "api_key": "sk-literal"}},
        {"model_name": "b", "litellm_params": {"model": "openai/x",
                                               "api_key": "os.environ/SOME_UPSTREAM_KEY"}},
        {"model_name": "c", "litellm_params": {"model": "openai/x",
                                               "api_base": "http://127.0.0.1:9/v1/"}},
    ])
    flags = [d.litellm_params.literal_api_key for d in settings.model_list]
    assert flags == [True, False, False]
    assert settings.model_list[2].litellm_params.api_base == "http://127.0.0.1:9/v1"
