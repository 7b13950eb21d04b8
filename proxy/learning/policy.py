"""May this turn be learned? The one answer, from the switches that decide it.

A turn is learned only when every switch is on:

- ``config`` — ``learning.enabled`` in the gateway's configuration;
- ``tenant`` — the tenant's run-time ``learning.enabled`` (an admin override);
- ``request`` — the request may write memory (its key can write and ``X-Memory`` is
  neither ``read-only`` nor ``off``);
- ``user`` — the user's personal learning switch;

and the user has not cleared their memory after the turn was said (``cleared_at``: what was
queued before a clear is discarded, never learned later).

Each asker reads the switches it knows and leaves the rest on: the response header and
the hand-over to the learning sink (``routes/chat.py``), the user API
(``routes/owner.py``), the admin stats (``routes/governance.py``), and the worker when an
exchange is buffered (``learning/buffering.py``), a batch is learned
(``learning/pipeline.py``) and its owners are resolved (``learning/owners.py``). A switch
is read only when the earlier ones are on (:attr:`Switches.tenant_learns`,
:meth:`Switches.learns`), as reading one may cost a store call.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from proxy.memory.store import UserSettings


@dataclass(frozen=True, slots=True)
class Switches:
    """The switches of one turn; ``True`` is on. ``cleared_at``: when the user last cleared
    their memory (epoch seconds), ``None`` when never."""

    config: bool = True
    tenant: bool = True
    request: bool = True
    user: bool = True
    cleared_at: float | None = None

    @property
    def tenant_learns(self) -> bool:
        """Whether learning runs for the tenant at all (configuration and override)."""
        return self.config and self.tenant

    def learns(self, said_at: float | None = None) -> bool:
        """Whether a turn said at ``said_at`` (epoch seconds; ``None``: now, after any
        clear) is learned: every switch on and not cleared since."""
        return self.tenant_learns and self.request and self.user and \
            not self.cleared_since(said_at)

    def cleared_since(self, said_at: float | None) -> bool:
        """Whether the user cleared their memory at or after ``said_at``."""
        return said_at is not None and self.cleared_at is not None and \
            said_at <= self.cleared_at

    def with_user(self, prefs: UserSettings) -> Switches:
        """These switches with the user's own: the personal switch and the last clear."""
        cleared = prefs.cleared_at.timestamp() if prefs.cleared_at is not None else None
        return replace(self, user=prefs.enable_personal_learning, cleared_at=cleared)
