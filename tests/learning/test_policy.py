"""May this turn be learned: every switch on, and no clear of the user's memory since."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from proxy.learning.policy import Switches
from proxy.memory.store import UserSettings

FLAGS = list(itertools.product([True, False], repeat=4))


@pytest.mark.parametrize(("config", "tenant", "request_", "user"), FLAGS)
def test_a_turn_is_learned_only_when_every_switch_is_on(
        config: bool, tenant: bool, request_: bool, user: bool) -> None:
    """Any one switch off (configuration, tenant, request, user) means not learned."""
    switches = Switches(config=config, tenant=tenant, request=request_, user=user)
    assert switches.learns() is (config and tenant and request_ and user)
    assert switches.tenant_learns is (config and tenant)


@pytest.mark.parametrize(("said_at", "learned"), [
    (None, True),    # now: after any clear
    (99.0, False),   # said before the clear
    (100.0, False),  # at the clear
    (100.5, True),   # after it
])
def test_a_clear_discards_what_was_said_before_it(said_at: float | None,
                                                  learned: bool) -> None:
    """A turn said at or before the user's last clear is not learned."""
    assert Switches(cleared_at=100.0).learns(said_at) is learned


def test_never_cleared_learns_any_turn() -> None:
    """Without a clear, the time a turn was said does not matter."""
    assert Switches().learns(0.0)


@pytest.mark.parametrize(("personal", "cleared", "said_at", "learned"), [
    (True, None, 5.0, True),
    (False, None, 5.0, False),
    (True, datetime.fromtimestamp(10, UTC), 5.0, False),
    (True, datetime.fromtimestamp(10, UTC), 11.0, True),
])
def test_the_users_settings_give_the_user_switches(
        personal: bool, cleared: datetime | None, said_at: float, learned: bool) -> None:
    """The personal switch and the last clear come from the user's settings."""
    prefs = UserSettings(enable_personal_learning=personal, cleared_at=cleared)
    assert Switches().with_user(prefs).learns(said_at) is learned


def test_the_user_switches_leave_the_others_as_they_were() -> None:
    """Reading the user's settings does not turn a tenant or request switch back on."""
    switches = Switches(tenant=False, request=False).with_user(UserSettings())
    assert (switches.tenant, switches.request, switches.user) == (False, False, True)
    assert not switches.learns()
