"""``auth``: gateway, admin and global admin keys, and end users signed in with a JWT."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, model_validator

from proxy.settings.base import (
    ENV_REFERENCE,
    GLOBAL_NAMESPACE,
    Section,
    resolve_env_reference,
    user_id_problem,
)


class GatewayKey(Section):
    """A gateway API key: the secret comes from the environment or is given as a digest."""

    key: SecretStr | None = None  # os.environ/NAME only
    key_sha256: str | None = None
    tenant: str = Field(default="default", min_length=1)
    # A key bound to one end user: body/header user ids are ignored (a client cannot act as
    # another user of the key).
    user: str | None = None
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _key_from_env(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        raw = data.get("key")
        if raw is None:
            return data
        if not isinstance(raw, str) or not raw.startswith(ENV_REFERENCE):
            raise ValueError(
                "auth key must be 'os.environ/NAME' or given as key_sha256; "
                "secrets are never written in the config file"
            )
        resolved = resolve_env_reference(raw, setting="auth key")
        if resolved is None:
            raise ValueError(f"auth key: environment variable {raw.removeprefix(ENV_REFERENCE)} "
                             "is not set")
        return {**data, "key": resolved}

    @model_validator(mode="after")
    def _one_secret(self) -> GatewayKey:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give exactly one of key (os.environ/NAME) or key_sha256")
        if self.key_sha256 is not None:
            digest = self.key_sha256.lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("key_sha256 must be 64 hex digits (sha256 of the key)")
        return self

    def digest(self) -> str:
        """Hex SHA-256 of the key."""
        if self.key is not None:
            return hashlib.sha256(self.key.get_secret_value().encode()).hexdigest()
        assert self.key_sha256 is not None
        return self.key_sha256.lower()


class JwtSettings(Section):
    """``auth.jwt``: end users signed in with a JSON Web Token (verified by PyJWT, keys
    read at startup, never fetched). Exactly one of ``jwks_file`` (a JWKS JSON file),
    ``public_key`` (PEM, or ``os.environ/NAME``) or ``hs256_secret`` (``os.environ/NAME``
    only). A valid token names the user (``user_claim``) like a user-bound key and the
    tenant (``tenant_claim``), which must be one of ``tenants``."""

    issuer: str = Field(min_length=1)
    audience: str = Field(min_length=1)
    jwks_file: Path | None = None
    public_key: SecretStr | None = None
    hs256_secret: SecretStr | None = None
    user_claim: str = "sub"
    tenant_claim: str = "tenant"
    tenants: list[str] = Field(min_length=1)
    leeway_seconds: int = Field(default=30, ge=0, le=600)

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_env(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        raw = data.get("hs256_secret")
        if raw is not None and (not isinstance(raw, str) or not raw.startswith(ENV_REFERENCE)):
            raise ValueError("auth.jwt.hs256_secret must be 'os.environ/NAME': secrets are "
                             "never written in the config file")
        for key in ("hs256_secret", "public_key"):
            value = data.get(key)
            if isinstance(value, str) and value.startswith(ENV_REFERENCE):
                resolved = resolve_env_reference(value, setting=f"auth.jwt.{key}")
                if resolved is None:
                    raise ValueError(f"environment variable "
                                     f"{value.removeprefix(ENV_REFERENCE)} named by "
                                     f"auth.jwt.{key} is not set")
                data[key] = resolved
        return data

    @model_validator(mode="after")
    def _one_key(self) -> JwtSettings:
        given = [k for k in ("jwks_file", "public_key", "hs256_secret")
                 if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("auth.jwt needs exactly one of jwks_file, public_key, "
                             "hs256_secret")
        if self.jwks_file is not None and not self.jwks_file.is_file():
            raise ValueError(f"auth.jwt.jwks_file {self.jwks_file} does not exist")
        return self


class AuthSettings(Section):
    keys: list[GatewayKey] = Field(default_factory=list)
    admin_keys: list[GatewayKey] = Field(default_factory=list)
    # Bring your own key: forward the caller's bearer token upstream instead of ours.
    forward_client_key: bool = False
    # Admin keys of no tenant (system memories; ?tenant= on stats and usage),
    # and end users signed in with a JWT.
    global_admin_keys: list[GatewayKey] = Field(default_factory=list)
    jwt: JwtSettings | None = None

    @model_validator(mode="after")
    def _tenants_named_well(self) -> AuthSettings:
        for index, key in enumerate(self.global_admin_keys):
            if "tenant" in key.model_fields_set or key.user is not None:
                raise ValueError(f"auth.global_admin_keys.{index}: a global admin key "
                                 "carries no tenant and no user")
        named = [("auth.keys", k.tenant) for k in self.keys] + \
            [("auth.admin_keys", k.tenant) for k in self.admin_keys] + \
            [("auth.jwt.tenants", t) for t in (self.jwt.tenants if self.jwt else [])]
        for where, tenant in named:
            if tenant == GLOBAL_NAMESPACE:
                raise ValueError(f"{where}: '{GLOBAL_NAMESPACE}' is the reserved name of "
                                 "the global (system memory) namespace, not a tenant")
        for where, keys in (("auth.keys", self.keys), ("auth.admin_keys", self.admin_keys)):
            for index, key in enumerate(keys):
                problem = None if key.user is None else user_id_problem(key.user)
                if problem is not None:
                    raise ValueError(f"{where}.{index}.user: {key.user!r} cannot name an end "
                                     f"user: {problem}")
        return self
