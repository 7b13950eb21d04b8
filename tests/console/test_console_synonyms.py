"""The admin's candidate synonyms in the console, in a real browser: the list with its
examples, "Accept" and "Reject", and the tenant's synonym groups that accepting fills."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from playwright.async_api import expect

from proxy.memory.synonyms import SynonymExample
from tests.console.conftest import (
    ADMIN_KEY,
    SESSION_LOOP,
    TENANT,
    axe_violations,
    fits_width,
    screenshot,
    sign_in,
)
from tests.console.test_console_admin import admin_get
from tests.fakes import Gateway

pytestmark = SESSION_LOOP  # one Chromium for all (tests/console/conftest.py)

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


async def seed(gw: Gateway) -> None:
    merges = [
        ("mountain hiking", "hiking", "containment", 0),
        ("introverted", "shy", "neighbour", 5),
        ("introverted", "shy", "neighbour", 9),
    ]
    for kept, said, how, minutes in merges:
        await gw.res.store.count_synonyms(
            TENANT,
            "alice",
            [
                SynonymExample(
                    field="traits",
                    kept=kept,
                    said=said,
                    how=how,  # type: ignore[arg-type]
                    at=T0 + timedelta(minutes=minutes),
                )
            ],
        )


async def test_candidate_synonyms_are_accepted_or_rejected_from_the_console(
    page: Any, console_gateway: Gateway
) -> None:
    """The open candidates are listed most merged first with their examples; "Accept"
    puts the pair into the tenant's synonym groups (the settings say so too) and takes it
    off the open list; "Reject" takes the other off; "All" shows both decided, with no
    button for the decision already made."""
    await seed(console_gateway)
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Synonyms").click()
    listing = page.get_by_role("table", name="Candidate synonyms", exact=True)
    rows = listing.locator("tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.first).to_contain_text("introverted / shy")
    await expect(rows.first.get_by_role("cell", name="2", exact=True)).to_be_visible()
    await rows.first.locator("summary", has_text="examples").click()
    await expect(rows.first).to_contain_text("“shy” → “introverted” (judged the same")
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await screenshot(page, "admin-synonyms")

    await page.get_by_role("button", name="Accept introverted / shy").click()
    await expect(rows).to_have_count(1)
    await expect(page.locator(".synonym-groups li")).to_have_text(["introverted / shy"])
    settings = await admin_get(console_gateway, "/v1/admin/settings")
    assert settings["overrides"]["learning.synonyms"] == [["introverted", "shy"]]

    await page.get_by_role("button", name="Reject mountain hiking / hiking").click()
    await expect(listing).to_have_count(0)
    await expect(page.get_by_text("Nothing here yet.").first).to_be_visible()

    await page.get_by_label("Status").select_option("all")
    await expect(rows).to_have_count(2)
    accepted = rows.filter(has_text="introverted / shy")
    await expect(accepted).to_contain_text("Accepted")
    await expect(accepted.get_by_role("button", name="Accept introverted / shy")).to_have_count(0)
    rejected = rows.filter(has_text="mountain hiking / hiking")
    await expect(rejected).to_contain_text("Rejected")
    await expect(
        rejected.get_by_role("button", name="Reject mountain hiking / hiking")
    ).to_have_count(0)
    assert await axe_violations(page) == []
