"""Scrubbing configured per tenant."""

from __future__ import annotations

import pytest

from proxy.learning.privacy import Scrubbers
from proxy.settings import ConfigError, PiiSettings, load_settings


def test_tenant_gets_its_own_patterns_on_top_of_the_default() -> None:
    """A tenant's extra pattern applies to it only; default kinds still apply to everyone."""
    scrubbers = Scrubbers(PiiSettings(tenants={"acme": {"patterns": {  # type: ignore[dict-item]
        "employee_id": r"EMP-\d{6}"}}}))
    text = "Badge EMP-123456, mail me at a.b@example.com"
    assert scrubbers.for_tenant("acme").scrub(text).text == "Badge [CUSTOM], mail me at [EMAIL]"
    assert scrubbers.for_tenant("other").scrub(text).text == "Badge EMP-123456, mail me at [EMAIL]"


def test_tenant_can_narrow_the_kinds() -> None:
    """A tenant that lists kinds gets only those scrubbed."""
    scrubbers = Scrubbers(PiiSettings(tenants={"lab": {"kinds": ["secret"]}}))  # type: ignore[dict-item]
    text = "key sk-proj-Ab3dE5fG7hI9jK1lM3nO5pQ7 and a.b@example.com"
    assert scrubbers.for_tenant("lab").scrub(text).text == "key [SECRET] and a.b@example.com"


def test_bad_pattern_stops_startup_with_the_setting_named(tmp_path: object) -> None:
    """An invalid regex is a configuration error naming learning.pii."""
    from proxy.resources import build_resources

    settings = load_settings(use_file=False, learning={"pii": {"patterns": {"bad": "("}}})
    with pytest.raises(ConfigError, match=r"learning\.pii"):
        build_resources(settings, store=None, ledger=None, upstream=None, queue=None)  # type: ignore[arg-type]
