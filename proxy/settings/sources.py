"""The root :class:`Settings` and how it is loaded: keyword overrides, then
``MEMORY_PROXY_*`` environment variables, then the YAML file (pydantic-settings sources)."""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from proxy.settings.alerts import AlertSettings
from proxy.settings.auth import AuthSettings
from proxy.settings.base import ENV_PREFIX, ConfigError
from proxy.settings.learning import LearningSettings
from proxy.settings.memory import MemorySettings
from proxy.settings.metrics import MetricsSettings
from proxy.settings.models import Deployment
from proxy.settings.server import IdentitySettings, ServerSettings, UpstreamSettings
from proxy.settings.storage import StorageSettings

DEFAULT_CONFIG_FILE = Path("config.yaml")

_yaml_file: ContextVar[Path | None] = ContextVar("memory_proxy_yaml_file", default=None)


class Settings(BaseSettings):
    """Root settings object. Build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    model_list: list[Deployment] = Field(default_factory=list)
    server: ServerSettings = Field(default_factory=ServerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    learning: LearningSettings = Field(default_factory=LearningSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    identity: IdentitySettings = Field(default_factory=IdentitySettings)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003 - hook signature
        file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003 - hook signature
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        yaml_file = _yaml_file.get()
        if yaml_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)

    @model_validator(mode="after")
    def _unique_learning_model(self) -> Settings:
        names = {d.model_name for d in self.model_list}
        if self.learning.model and names and self.learning.model not in names:
            raise ValueError(
                f"learning.model '{self.learning.model}' is not a model_name in model_list "
                f"(known: {', '.join(sorted(names))})"
            )
        return self


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The YAML file to read: ``explicit``, else ``$MEMORY_PROXY_CONFIG``, else ``./config.yaml``.

    Raises :class:`ConfigError` when an explicitly named file does not exist.
    """
    named = explicit or os.environ.get(f"{ENV_PREFIX}CONFIG")
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist (from --config / "
                              f"{ENV_PREFIX}CONFIG)")
        return path
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def load_settings(
    path: str | os.PathLike[str] | None = None, *, use_file: bool = True, **overrides: Any
) -> Settings:
    """Load settings from YAML + environment + ``overrides``.

    ``use_file=False`` ignores every YAML file (tests). Raises :class:`ConfigError` with
    the dotted name of each invalid setting.
    """
    yaml_path = config_path(path) if use_file else None
    token = _yaml_file.set(yaml_path)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, yaml_path)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{yaml_path} is not valid YAML: {exc}") from exc
    except SettingsError as exc:
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise ConfigError(f"invalid configuration in the environment ({exc}{cause}); lists "
                          f"and mappings in {ENV_PREFIX}* variables are JSON") from exc
    finally:
        _yaml_file.reset(token)


def _describe(exc: ValidationError, yaml_path: Path | None) -> str:
    sources = [str(yaml_path)] if yaml_path else []
    sources.append(f"{ENV_PREFIX}* environment variables")
    lines = [f"invalid configuration (from {' and '.join(sources)}):"]
    for error in exc.errors():
        loc = ".".join(str(part) for part in error["loc"]) or "(root)"
        lines.append(f"  {loc}: {error['msg']}")
    return "\n".join(lines)
