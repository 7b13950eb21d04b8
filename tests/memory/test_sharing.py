"""Which personal memories read as a fact about their owner (docs/design.md#promotion)."""

from __future__ import annotations

import pytest

from proxy.memory.sharing import about_owner


@pytest.mark.parametrize(("content", "subject", "why"), [
    ("Is allergic to hazelnuts", "user", "opens with 'Is'"),
    ("Usually works from home on Mondays", "user", "opens with 'Usually'"),
    ("Allergic to shellfish", "user", "opens with 'Allergic'"),
    ("Doesn't eat pork", "user", "opens with 'Doesn't'"),
    ("My manager is Dana", "user", "first person ('My')"),
    ("Lunch with me is at noon", "user", "first person ('me')"),
    ("I'm vegan", "user", "first person ('I'm')"),
    ("Plans to move to Lisbon next year", "user", "opens with 'Plans'"),
    ("Plans for Q3 are due in May", "user", "opens with 'Plans'"),
    ("喜欢爬山", "user", "opens with a predicate"),
    ("周末我去游泳", "user", "first person ('我')"),
])
def test_a_fact_about_the_owner_is_named_with_the_reason(content: str, subject: str,
                                                          why: str) -> None:
    """Subjectless notes and first-person texts read as about the owner; the reason
    names the word that shows it."""
    reason = about_owner(content=content, subject=subject)
    assert reason is not None
    assert why in reason


@pytest.mark.parametrize(("content", "title", "subject"), [
    ("The office is closed on Fridays", "", "user"),
    ("Expense reports go through the Fin portal", "Expenses", "user"),
    ("Our users pay monthly by invoice", "", "user"),
    ("The user interface is in German", "", "user"),
    ("ME and NH offices share a van", "", "user"),
    ("我们公司周五不上班", "", "user"),
    ("Drinks are free on Fridays", "", "user"),
    ("Single sign-on is required for the portal", "", "user"),
    ("Is allergic to hazelnuts", "", "Dana"),
])
def test_general_knowledge_and_facts_about_a_named_person_pass(content: str, title: str,
                                                               subject: str) -> None:
    """A text with a subject of its own, "we", and a fact whose subject is another person
    are not about the owner."""
    assert about_owner(content=content, title=title, subject=subject) is None


def test_a_first_person_title_counts_too() -> None:
    """The title is injected when the content is empty, so it is read as well."""
    assert about_owner(content="The canteen opens at noon", title="My lunch") is not None
