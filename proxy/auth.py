"""Gateway authentication: an API key → the caller's tenant (and, when bound, its user).

Keys are held as SHA-256 digests only; a presented key is hashed and compared with
:func:`hmac.compare_digest` against every configured digest, so timing does not depend on
how much of a key matches. With neither ``auth.keys`` nor ``auth.jwt`` configured the
gateway runs open (every caller is tenant ``default``), which :func:`create_app` warns
about at startup.

Global admin keys (``auth.global_admin_keys``) carry no tenant: they open the admin API
(system memories; other tenants' stats and usage with ``?tenant=``) and
:meth:`KeyRing.identify` (``GET /v1/me``), never chat or another end-user route (403).
A bearer token of three base64url parts is verified as a JWT when ``auth.jwt`` is set
(:class:`JwtVerifier`): it names the tenant and the user like a user-bound key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import jwt

from proxy.errors import AuthenticationError, PermissionDeniedError
from proxy.settings import (
    GLOBAL_NAMESPACE,
    AuthSettings,
    GatewayKey,
    JwtSettings,
    user_id_problem,
)

Role = Literal["user", "app", "admin", "global_admin"]
OPEN_TENANT = "default"
GATEWAY_KEY_HEADER = "x-memory-proxy-key"
# RFC 7519 compact serialisation: three base64url parts (the signature may be empty only
# for "alg": "none", which is never accepted).
_JWT_SHAPE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
# Public-key algorithms accepted with ``auth.jwt.public_key`` (never HS* with a public key).
_ASYMMETRIC = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
               "ES512", "EdDSA"]


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
    # A global admin key (tenant is then the reserved GLOBAL_NAMESPACE).
    is_global_admin: bool = False

    @property
    def role(self) -> Role:
        """What the key is (``GET /v1/me``): ``"global_admin"`` for a global admin key,
        ``"admin"`` for an admin key, ``"user"`` for a key bound to one end user or a JWT,
        ``"app"`` for an application key (and open mode). The one place a role is
        derived."""
        if self.is_global_admin:
            return "global_admin"
        if self.is_admin:
            return "admin"
        if self.bound_user is not None:
            return "user"
        return "app"


class JwtVerifier:
    """Verifies end-user JWTs against keys loaded once at startup (PyJWT; no network).

    :meth:`verify` returns ``(tenant, user)`` or raises :class:`AuthenticationError` (401)
    for a bad signature, a wrong issuer or audience, an expired token, a missing user or
    tenant claim, a user id that breaks the user-id rule the user header is held to
    (:func:`~proxy.settings.user_id_problem`: blank, over 256 characters, a control
    character, reserved), or a tenant outside ``auth.jwt.tenants``."""

    def __init__(self, settings: JwtSettings) -> None:
        self._settings = settings
        self._jwks: jwt.PyJWKSet | None = None
        self._key: Any = None
        if settings.jwks_file is not None:
            self._jwks = jwt.PyJWKSet.from_json(settings.jwks_file.read_text())
        elif settings.public_key is not None:
            self._key = settings.public_key.get_secret_value()
            self._algorithms = _ASYMMETRIC
        else:
            assert settings.hs256_secret is not None
            self._key = settings.hs256_secret.get_secret_value()
            self._algorithms = ["HS256"]

    def verify(self, token: str) -> tuple[str, str]:
        s = self._settings
        try:
            key, algorithms = self._key, getattr(self, "_algorithms", [])
            if self._jwks is not None:
                kid = jwt.get_unverified_header(token).get("kid")
                matching = [k for k in self._jwks.keys if kid is None or k.key_id == kid]
                if not matching:
                    raise AuthenticationError("The token's key id is not in auth.jwt's "
                                              "key set.")
                key, algorithms = matching[0], [matching[0].algorithm_name]
            claims = jwt.decode(token, key=key, algorithms=algorithms, audience=s.audience,
                                issuer=s.issuer, leeway=s.leeway_seconds,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError as exc:
            raise AuthenticationError("The token has expired.", code="token_expired") \
                from exc
        except jwt.PyJWTError as exc:
            raise AuthenticationError(f"Invalid token: {exc}.", code="invalid_token") \
                from exc
        user, tenant = claims.get(s.user_claim), claims.get(s.tenant_claim)
        if not isinstance(user, str) or not user:
            raise AuthenticationError(f"The token names no user (claim {s.user_claim!r}).",
                                      code="invalid_token")
        problem = user_id_problem(user)
        if problem is not None:
            # The rule the user header and the body are held to (one rule for every id).
            raise AuthenticationError(f"The token's user (claim {s.user_claim!r}) cannot name "
                                      f"an end user: {problem}.", code="invalid_token")
        if not isinstance(tenant, str) or tenant not in s.tenants:
            raise AuthenticationError("The token's tenant is not one this gateway serves.",
                                      code="invalid_token")
        return tenant, user


@dataclass(frozen=True, slots=True)
class _Entry:
    digest: bytes
    key: GatewayKey


class KeyRing:
    """Configured gateway and admin keys."""

    def __init__(self, settings: AuthSettings) -> None:
        self._keys = [_Entry(bytes.fromhex(k.digest()), k) for k in settings.keys]
        self._admin = [_Entry(bytes.fromhex(k.digest()), k) for k in settings.admin_keys]
        self._global = [_Entry(bytes.fromhex(k.digest()), k)
                        for k in settings.global_admin_keys]
        self._jwt = JwtVerifier(settings.jwt) if settings.jwt is not None else None
        self._forward = settings.forward_client_key

    @property
    def open_mode(self) -> bool:
        return not self._keys and self._jwt is None

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """Authenticate a chat / memory API caller from its request headers.

        The key is read from ``Authorization: Bearer …`` (or ``api-key``); with
        ``forward_client_key`` the bearer goes upstream and the gateway key is read from
        ``X-Memory-Proxy-Key``. Admin keys are accepted here too (tenant from the key); a
        JWT (``auth.jwt``) names its tenant and user. Raises :class:`AuthenticationError`
        (401) for a missing or unknown key or a bad token, and
        :class:`PermissionDeniedError` (403) for a global admin key.
        """
        principal = self.identify(headers)
        if principal.is_global_admin:
            raise PermissionDeniedError(
                "A global admin key opens the admin API and GET /v1/me only, no chat or "
                "other end-user route.")
        return principal

    def identify(self, headers: Mapping[str, str]) -> Principal:
        """Who is calling, for every kind of credential (``GET /v1/me``): as
        :meth:`authenticate`, but a global admin key is answered with a principal of the
        reserved global namespace (``is_global_admin``) instead of 403."""
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
        if self._jwt is not None and _JWT_SHAPE.match(presented):
            tenant, user = self._jwt.verify(presented)
            return Principal(tenant=tenant, bound_user=user, key_name="jwt",
                             client_key=client_key)
        entry = _match(self._keys, presented) or _match(self._admin, presented)
        if entry is None:
            glob = _match(self._global, presented)
            if glob is not None:
                return Principal(tenant=GLOBAL_NAMESPACE, key_name=glob.key.name,
                                 is_admin=True, is_global_admin=True)
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
        key is a valid gateway key but not an admin key, or no admin keys are configured.
        A global admin key gives ``is_global_admin`` and the reserved global namespace as
        tenant (the route decides what it may do)."""
        presented = _bearer(headers)
        if not self._admin and not self._global:
            raise PermissionDeniedError(
                "The admin API is disabled: configure auth.admin_keys to enable it."
            )
        if not presented:
            raise AuthenticationError("Missing admin API key.")
        entry = _match(self._admin, presented)
        if entry is None:
            glob = _match(self._global, presented)
            if glob is not None:
                return Principal(tenant=GLOBAL_NAMESPACE, key_name=glob.key.name,
                                 is_admin=True, is_global_admin=True)
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
