"""The transcript the learning model reads leaves out structured-output scaffolding: a
user message that is a library's re-ask is dropped, appended format instructions are cut,
the assistant's reply and the user's own words stay."""

from __future__ import annotations

from proxy.learning.exchange import TranscriptMessage
from proxy.learning.prompts import clip_batch
from proxy.learning.queue import Batch

REASK = "Correct your JSON ONLY RESPONSE, based on the following errors:\nage: required"
FORMAT = ("The output should be formatted as a JSON instance that conforms to the JSON "
          "schema below.")


def batch_of(*messages: tuple[str, str]) -> Batch:
    return Batch(key="b_1", tenant="t", user="u", conversation="c", channel="private",
                 model="m", messages=tuple(
                     TranscriptMessage(role=role, text=text, fingerprint=f"f{i}")
                     for i, (role, text) in enumerate(messages)),
                 oldest_at=0.0, newest_at=0.0)


def test_a_reask_is_left_out_and_instructions_cut() -> None:
    """Only the user's own words and the assistant's replies reach the learning model."""
    batch = batch_of(("user", f"I live in Lisbon.\n\n{FORMAT}"), ("assistant", "{}"),
                     ("user", REASK), ("assistant", '{"city": "Lisbon"}'))
    shown = clip_batch(batch)
    assert [(m.role, m.text) for m in shown.messages] == [
        ("user", "I live in Lisbon."), ("assistant", "{}"),
        ("assistant", '{"city": "Lisbon"}')]
    assert not shown.user_messages[1:]


def test_a_batch_without_scaffolding_is_unchanged() -> None:
    """Ordinary messages pass as the same batch object."""
    batch = batch_of(("user", "I work with JSON schemas."), ("assistant", "Nice."))
    assert clip_batch(batch) is batch
