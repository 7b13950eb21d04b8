"""Gateway authentication: an API key → the caller's tenant (and, when bound, its user).

Keys are held as SHA-256 digests only; a presented key is hashed and compared with
:func:`hmac.compare_digest` against every configured digest, so timing does not depend on
how much of a key matches. With no ``auth.keys`` configured the gateway runs open (every
caller is tenant ``default``), which :func:`create_app` warns about at startup.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from proxy.errors import AuthenticationError, PermissionDeniedError
from proxy.settings import AuthSettings, GatewayKey

Role = Literal["user", "app", "admin", "global_admin"]
OPEN_TENANT = "default"
GATEWAY_KEY_HEADER = "x-memory-proxy-key"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant a key belongs to and, for user-bound keys, the user."""

    tenant: str
    bound_user: str | None = None
    key_name: str | None = None
    is_admin: bool = False
    open_mode: bool = False
    # The caller's own bearer token, kept only when ``auth.forward_client_key`` is on.
    client_key: str | None = None

    @property
    def role(self) -> Role:
        """What the key is (``GET /v1/me``): ``"admin"`` for an admin key, ``"user"`` for
        a key bound to one end user, ``"app"`` for an application key (and open mode).
        The one place a role is derived."""
        if self.is_admin:
            return "admin"
        if self.bound_user is not None:
            return "user"
        return "app"


@dataclass(frozen=True, slots=True)
class _Entry:
    digest: bytes
    key: GatewayKey


class KeyRing:
    """Configured gateway and admin keys."""

    def __init__(self, settings: AuthSettings) -> None:
        self._keys = [_Entry(bytes.fromhex(k.digest()), k) for k in settings.keys]
        self._admin = [_Entry(bytes.fromhex(k.digest()), k) for k in settings.admin_keys]
        self._forward = settings.forward_client_key

    @property
    def open_mode(self) -> bool:
        return not self._keys

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """Authenticate a chat / memory API caller from its request headers.

        The key is read from ``Authorization: Bearer …`` (or ``api-key``); with
        ``forward_client_key`` the bearer goes upstream and the gateway key is read from
        ``X-Memory-Proxy-Key``. Admin keys are accepted here too (tenant from the key).
        Raises :class:`AuthenticationError` (401) for a missing or unknown key.
        """
        bearer = _bearer(headers)
        if self._forward:
            presented = headers.get(GATEWAY_KEY_HEADER)
            client_key = bearer
        else:
            presented, client_key = bearer, None
        if self.open_mode:
            return Principal(tenant=OPEN_TENANT, open_mode=True, client_key=client_key)
        if not presented:
            raise AuthenticationError(
                "Missing API key. Send 'Authorization: Bearer <gateway key>'"
                + (f" and '{GATEWAY_KEY_HEADER}'" if self._forward else "") + "."
            )
        entry = _match(self._keys, presented) or _match(self._admin, presented)
        if entry is None:
            raise AuthenticationError("Incorrect API key provided.")
        return Principal(
            tenant=entry.key.tenant,
            bound_user=entry.key.user,
            key_name=entry.key.name,
            is_admin=any(e is entry for e in self._admin),
            client_key=client_key,
        )

    def authenticate_admin(self, headers: Mapping[str, str]) -> Principal:
        """Authenticate an admin API caller. 401 for a missing/unknown key, 403 when the
        key is a valid gateway key but not an admin key, or no admin keys are configured."""
        presented = _bearer(headers)
        if not self._admin:
            raise PermissionDeniedError(
                "The admin API is disabled: configure auth.admin_keys to enable it."
            )
        if not presented:
            raise AuthenticationError("Missing admin API key.")
        entry = _match(self._admin, presented)
        if entry is None:
            if _match(self._keys, presented) is not None:
                raise PermissionDeniedError("This key is not an admin key.")
            raise AuthenticationError("Incorrect API key provided.")
        return Principal(tenant=entry.key.tenant, key_name=entry.key.name, is_admin=True)


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if value:
        scheme, _, token = value.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        return None
    return headers.get("api-key") or None


def _match(entries: list[_Entry], presented: str) -> _Entry | None:
    digest = hashlib.sha256(presented.encode()).digest()
    found: _Entry | None = None
    for entry in entries:  # no early exit: every digest is compared
        if hmac.compare_digest(entry.digest, digest):
            found = entry
    return found
