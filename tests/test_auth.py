"""Gateway authentication: global admin keys and end-user JWTs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from proxy.auth import KeyRing
from proxy.errors import AuthenticationError, PermissionDeniedError
from proxy.settings import GLOBAL_NAMESPACE, AuthSettings, ConfigError, load_settings

SECRET = "s3cret-for-hs256-tests-only-0123456789"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def claims(**extra: Any) -> dict[str, Any]:
    base = {"iss": "https://id.example", "aud": "memory-proxy", "sub": "alice",
            "tenant": "acme", "exp": int(time.time()) + 600}
    base.update(extra)
    return base


@pytest.fixture
def hs_ring(monkeypatch: pytest.MonkeyPatch) -> KeyRing:
    monkeypatch.setenv("JWT_SECRET", SECRET)
    monkeypatch.setenv("GLOBAL_KEY", "global-secret")
    monkeypatch.setenv("ADMIN_KEY", "admin-secret")
    return KeyRing(AuthSettings.model_validate({
        "admin_keys": [{"key": "os.environ/ADMIN_KEY", "tenant": "acme"}],
        "global_admin_keys": [{"key": "os.environ/GLOBAL_KEY", "name": "root"}],
        "jwt": {"issuer": "https://id.example", "audience": "memory-proxy",
                "hs256_secret": "os.environ/JWT_SECRET", "tenants": ["acme", "globex"]},
    }))


def test_valid_jwt_names_tenant_and_user(hs_ring: KeyRing) -> None:
    """A valid token is a user-bound caller of the tenant it names; JWT alone closes the
    gateway (no open mode)."""
    principal = hs_ring.authenticate(bearer(jwt.encode(claims(), SECRET)))
    assert (principal.tenant, principal.bound_user, principal.is_admin) == \
        ("acme", "alice", False)
    assert not hs_ring.open_mode


@pytest.mark.parametrize("token", [
    jwt.encode(claims(), "another-secret-of-enough-length-000000"),
    jwt.encode(claims(exp=int(time.time()) - 3600), SECRET),
    jwt.encode(claims(tenant="initech"), SECRET),
    jwt.encode(claims(aud="someone-else"), SECRET),
    jwt.encode(claims(iss="https://evil.example"), SECRET),
    jwt.encode({k: v for k, v in claims().items() if k != "sub"}, SECRET),
    jwt.encode({k: v for k, v in claims().items() if k != "exp"}, SECRET),
    jwt.encode(claims(), key=None, algorithm="none"),
], ids=["bad-signature", "expired", "tenant-not-allowed", "audience", "issuer", "no-user",
        "no-expiry", "alg-none"])
def test_bad_tokens_are_401(hs_ring: KeyRing, token: str) -> None:
    """A bad signature, an expired token, a tenant outside ``tenants``, a wrong issuer or
    audience, a missing claim and an unsigned token are all refused with 401."""
    with pytest.raises(AuthenticationError):
        hs_ring.authenticate(bearer(token))


def test_global_admin_key_opens_admin_and_identity_only(hs_ring: KeyRing) -> None:
    """A global admin key is refused on end-user routes (403), identified for GET /v1/me
    and accepted by the admin API, always in the reserved global namespace."""
    with pytest.raises(PermissionDeniedError):
        hs_ring.authenticate(bearer("global-secret"))
    me = hs_ring.identify(bearer("global-secret"))
    assert (me.tenant, me.is_global_admin, me.key_name) == (GLOBAL_NAMESPACE, True, "root")
    admin = hs_ring.authenticate_admin(bearer("global-secret"))
    assert admin.is_global_admin
    tenant_admin = hs_ring.authenticate_admin(bearer("admin-secret"))
    assert (tenant_admin.tenant, tenant_admin.is_global_admin) == ("acme", False)


def _ec_key() -> tuple[ec.EllipticCurvePrivateKey, str]:
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, pem


def test_public_key_and_jwks_file(tmp_path: Path) -> None:
    """ES256 tokens verify against a configured PEM public key or a JWKS file (by kid);
    a token signed by another key is refused."""
    private, pem = _ec_key()
    ring = KeyRing(AuthSettings.model_validate({"jwt": {
        "issuer": "https://id.example", "audience": "memory-proxy", "public_key": pem,
        "tenants": ["acme"]}}))
    token = jwt.encode(claims(), private, algorithm="ES256")
    assert ring.authenticate(bearer(token)).bound_user == "alice"
    other, _ = _ec_key()
    with pytest.raises(AuthenticationError):
        ring.authenticate(bearer(jwt.encode(claims(), other, algorithm="ES256")))
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(private.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "ES256", "use": "sig"}]}))
    ring = KeyRing(AuthSettings.model_validate({"jwt": {
        "issuer": "https://id.example", "audience": "memory-proxy", "jwks_file": str(jwks),
        "tenants": ["acme"], "user_claim": "email"}}))
    signed = jwt.encode(claims(email="a@acme.example"), private, algorithm="ES256",
                        headers={"kid": "k1"})
    assert ring.authenticate(bearer(signed)).bound_user == "a@acme.example"
    with pytest.raises(AuthenticationError):
        ring.authenticate(bearer(jwt.encode(claims(), private, algorithm="ES256",
                                            headers={"kid": "unknown"})))


def test_a_non_jwt_bearer_is_still_a_key(hs_ring: KeyRing) -> None:
    """Anything but three base64url parts is looked up as a gateway key."""
    assert hs_ring.authenticate(bearer("admin-secret")).is_admin
    with pytest.raises(AuthenticationError):
        hs_ring.authenticate(bearer("a.b"))


@pytest.mark.parametrize("auth", [
    {"keys": [{"key_sha256": "0" * 64, "tenant": GLOBAL_NAMESPACE}]},
    {"admin_keys": [{"key_sha256": "0" * 64, "tenant": GLOBAL_NAMESPACE}]},
    {"global_admin_keys": [{"key_sha256": "0" * 64, "tenant": "acme"}]},
    {"jwt": {"issuer": "i", "audience": "a", "hs256_secret": "literal", "tenants": ["t"]}},
    {"jwt": {"issuer": "i", "audience": "a", "tenants": ["t"]}},
], ids=["reserved-key-tenant", "reserved-admin-tenant", "global-with-tenant",
        "literal-secret", "no-key"])
def test_bad_auth_settings_are_refused_at_startup(auth: dict[str, Any]) -> None:
    """The reserved global namespace is no tenant name, a global key names no tenant, and
    a JWT setup needs exactly one key source with secrets from the environment."""
    with pytest.raises(ConfigError):
        load_settings(use_file=False, auth=auth)
