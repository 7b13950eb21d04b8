"""The scrub entry point: :class:`Scrubber` runs the selected detectors and the tenant's
patterns, merges what they find and renders placeholders, rescanning until nothing more is
found."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from functools import partial

import phonenumbers

from proxy.learning.pii.credentials import find_secrets
from proxy.learning.pii.emails import find_emails
from proxy.learning.pii.findings import (
    KINDS,
    PLACEHOLDER_RE,
    Finding,
    ScrubResult,
    Span,
    merge,
    render,
    to_original,
)
from proxy.learning.pii.ids import find_cards, find_cn_ids
from proxy.learning.pii.ips import find_ips
from proxy.learning.pii.phones import find_phones

_DIGITS = "0123456789"
_MAX_RESCANS = 2


class Scrubber:
    """Finds and replaces personal data and secrets; cheap to call, safe to share.

    ``kinds`` selects built-in kinds (``None`` = all of ``KINDS``; an unknown name raises
    ``ValueError``). ``default_region`` is the ISO 3166 region used to read phone numbers
    written without ``+`` (``"CN"``). ``extra_patterns`` maps a name to a regex; its matches
    are scrubbed as kind ``custom:<name>`` with placeholder ``[CUSTOM]``, whatever ``kinds``
    says (a tenant who configured a pattern wants it applied). Patterns are compiled once,
    here; an invalid regex raises ``ValueError``.
    """

    __slots__ = ("_custom", "_detectors", "_region")

    def __init__(
        self,
        *,
        kinds: frozenset[str] | None = None,
        default_region: str = "CN",
        extra_patterns: Mapping[str, str] | None = None,
    ) -> None:
        selected = KINDS if kinds is None else frozenset(kinds)
        unknown = selected - KINDS
        if unknown:
            raise ValueError(
                f"unknown PII kinds {sorted(unknown)}; choose from {sorted(KINDS)}"
            )
        region = default_region.upper()
        if region not in phonenumbers.SUPPORTED_REGIONS:
            raise ValueError(
                f"default_region {default_region!r} is not a phonenumbers region code "
                "(ISO 3166-1 alpha-2, e.g. 'CN', 'US')"
            )
        self._region = region
        custom: list[tuple[str, re.Pattern[str]]] = []
        for name, pattern in (extra_patterns or {}).items():
            if not name:
                raise ValueError("extra_patterns names must be non-empty")
            try:
                custom.append((f"custom:{name}", re.compile(pattern)))
            except re.error as exc:
                raise ValueError(f"extra pattern {name!r} is not a valid regex: {exc}") from exc
        self._custom = tuple(custom)
        table: dict[str, Callable[[str, int], Iterator[Span]]] = {
            "secret": find_secrets,
            "cn_id": find_cn_ids,
            "bank_card": find_cards,
            "email": find_emails,
            "phone": partial(find_phones, region=region),
            "ip": find_ips,
        }
        self._detectors = tuple(fn for kind, fn in table.items() if kind in selected)

    # --- public --------------------------------------------------------------------------
    def scrub(self, text: str) -> ScrubResult:
        """Replace every finding in ``text`` with its placeholder.

        Returns the new text and the findings (offsets into ``text``, sorted, disjoint).
        Text without findings is returned as the same object. The result is rescanned:
        removing a finding can expose a neighbour its context hid (``1.2.3.4.13800138000``
        holds an IP once the phone is gone), so the output is a fixed point of ``scrub``.
        """
        findings = self._find(text)
        if not findings:
            return ScrubResult(text, ())
        out = render(text, findings)
        for _ in range(_MAX_RESCANS):
            extra = self._find(out)
            if not extra:
                break
            merged = [*findings, *to_original(findings, extra)]
            findings = tuple(sorted(merged, key=lambda f: f.start))
            out = render(text, findings)
        return ScrubResult(out, findings)

    def contains_pii(self, text: str) -> bool:
        """True when ``scrub(text)`` would change the text."""
        return bool(self._find(text))

    # --- pipeline ------------------------------------------------------------------------
    def _find(self, text: str) -> tuple[Finding, ...]:
        spans: list[Span] = []
        digits = sum(map(text.count, _DIGITS))
        for detect in self._detectors:
            spans.extend(detect(text, digits))
        for kind, pattern in self._custom:
            spans.extend(
                (m.start(), m.end(), kind) for m in pattern.finditer(text) if m.end() > m.start()
            )
        if not spans:
            return ()
        if "[" in text:
            taken = [(m.start(), m.end()) for m in PLACEHOLDER_RE.finditer(text)]
            if taken:
                spans = [s for s in spans if not any(s[0] < e and b < s[1] for b, e in taken)]
        return merge(spans)
