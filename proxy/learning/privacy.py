"""Which scrubber applies to which tenant (PII scrub, configurable per tenant:
docs/design.md#privacy).

``learning.pii`` sets the default kinds and extra patterns; ``learning.pii.tenants`` gives a
tenant its own (a tenant entry replaces the default kinds when it names any, and adds its
patterns to the default ones). Scrubbers are built once at startup, so a bad pattern or kind
stops startup instead of failing a request.
"""

from __future__ import annotations

from proxy.learning.pii import Scrubber
from proxy.settings import PiiSettings


class Scrubbers:
    def __init__(self, settings: PiiSettings) -> None:
        self.default = Scrubber(
            kinds=frozenset(settings.kinds) if settings.kinds is not None else None,
            extra_patterns=settings.patterns,
        )
        self._tenants = {
            tenant: Scrubber(
                kinds=frozenset(override.kinds if override.kinds is not None
                                else settings.kinds or ()) or None,
                extra_patterns={**settings.patterns, **override.patterns},
            )
            for tenant, override in settings.tenants.items()
        }

    def for_tenant(self, tenant: str) -> Scrubber:
        return self._tenants.get(tenant, self.default)
