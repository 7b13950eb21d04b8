"""Size limits of learning: no learned memory is larger than a manual one may be, and what
the learning model is sent is bounded by a per-message cap and by its context window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.learning.answers import CandidateFact
from proxy.learning.exchange import TranscriptMessage
from proxy.learning.filters import FactFilter
from proxy.learning.pii import Scrubber
from proxy.learning.prompts import (
    MAX_MESSAGE_CHARS,
    clip_batch,
    clip_message,
    fit_batch,
    truncation_marker,
)
from proxy.learning.queue import Batch
from proxy.memory.records import MAX_CONTENT_CHARS, MAX_TITLE_CHARS
from proxy.memory.store import ListQuery
from proxy.tokens import TokenCounter
from tests.fakes import FakeUpstream, Gateway, make_settings, running_gateway

# Distinct words, so that the tokenizer cannot fold the text into a few long tokens.
WORDS = ("river", "stone", "maple", "cloud", "harbor", "lantern", "copper", "meadow",
         "violet", "ember")


def filler(chars: int, *, tag: str = "") -> str:
    text = tag
    index = 0
    while len(text) < chars:
        text += f" {WORDS[index % len(WORDS)]}{index % 97}"
        index += 1
    return text[:chars]


def fact(content: str, title: str | None = None) -> dict[str, Any]:
    return {"title": content[:30] if title is None else title, "content": content,
            "category": "user_preference", "subject": "user"}


def candidate(content: str, title: str = "Garden") -> CandidateFact:
    return CandidateFact(title=title, content=content, category="domain", subcategory="",
                         tags=(), subject="user", supersedes=(), duplicate_of=None,
                         source_turns=())


def batch_of(*texts: str) -> Batch:
    return Batch(key="b_1", tenant="t", user="u", conversation="c", channel="private",
                 model="m", messages=tuple(
                     TranscriptMessage(role="user" if i % 2 == 0 else "assistant", text=t,
                                       fingerprint=f"f{i}") for i, t in enumerate(texts)),
                 oldest_at=0.0, newest_at=0.0)


def rejected(gateway: Gateway, reason: str) -> float:
    metric = gateway.res.metrics.learning_events.labels(event="fact_rejected", label=reason)
    return float(metric._value.get())


async def memories(gateway: Gateway) -> list[str]:
    found = await gateway.res.store.list_memories(ListQuery(tenant="default", user="u1"))
    return sorted(m.content for m in found)


async def chat(gateway: Gateway, messages: list[dict[str, str]]) -> None:
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", headers={"X-User-Id": "u1"},
                                     json={"model": "m", "messages": messages})
    assert response.status_code == 200, response.text


# the fact filter -------------------------------------------------------------------------
def test_facts_up_to_the_manual_caps_pass_longer_ones_are_too_long() -> None:
    """A fact as long as a manual memory may be is kept; one character more in the content
    or the title is rejected as too_long."""
    said = "I grow tomatoes in my garden."
    flt = FactFilter(user_text=said, scrubber=Scrubber())
    longest = "Grows tomatoes in the garden" + " garden" * 1000
    assert flt.check(candidate(longest[:MAX_CONTENT_CHARS])) is None
    assert flt.check(candidate(longest[:MAX_CONTENT_CHARS + 1])) == "too_long"
    title = ("Garden " * 40)[:MAX_TITLE_CHARS]
    assert flt.check(candidate("Grows tomatoes", title=title)) is None
    assert flt.check(candidate("Grows tomatoes", title=title + "x")) == "too_long"


# bounding the transcript -----------------------------------------------------------------
def test_long_messages_are_cut_around_a_visible_marker() -> None:
    """A message over MAX_MESSAGE_CHARS keeps its head and tail and says how much was cut;
    shorter ones are untouched."""
    text = "HEAD " + filler(20_000) + " TAIL"
    cut = clip_message(text)
    assert cut.startswith("HEAD ")
    assert cut.endswith(" TAIL")
    kept = MAX_MESSAGE_CHARS - len(truncation_marker(len(text)))
    assert truncation_marker(len(text) - kept) in cut
    assert len(cut) <= MAX_MESSAGE_CHARS
    assert clip_message(cut) == cut  # cut once, at the sink; later cuts change nothing
    short = filler(MAX_MESSAGE_CHARS)
    assert clip_message(short) == short
    batch = batch_of(short, text)
    assert [m.text for m in clip_batch(batch).messages] == [short, cut]
    assert clip_batch(batch_of(short)) == batch_of(short)


def test_fitting_keeps_the_newest_messages_within_the_budget() -> None:
    """Oldest messages go first; when even the newest does not fit, it is cut to fit; a
    batch within the budget is returned as is."""
    counter = TokenCounter()

    def count(text: str) -> int:
        return counter.count(text, "cl100k_base")

    batch = batch_of(*(filler(2000, tag=f"message{i}") for i in range(6)))
    whole = fit_batch(batch, budget=100_000, count=count)
    assert whole is batch
    fitted = fit_batch(batch, budget=1500, count=count)
    kept = [m.text.split()[0] for m in fitted.messages]
    assert 0 < len(kept) < 6
    assert kept == [f"message{i}" for i in range(6 - len(kept), 6)]
    assert sum(count(m.text) for m in fitted.messages) <= 1500
    tight = fit_batch(batch, budget=200, count=count)
    assert len(tight.messages) == 1
    newest = tight.messages[0].text
    assert newest.startswith("message5")
    assert "characters cut" in newest
    assert count(newest) <= 200
    assert fit_batch(batch, budget=0, count=count).messages == ()


async def test_an_oversize_message_reaches_the_learning_model_truncated(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """A huge user message is cut to MAX_MESSAGE_CHARS (with the marker) in both learning
    calls; the chat request itself is relayed whole."""
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1})
    huge = "I keep bees on my roof. " + "lorem " * 200_000 + " The end."
    async with running_gateway(settings, upstream) as gateway:
        await chat(gateway, [{"role": "user", "content": huge}])
        await gateway.settle()
        assert upstream.last_chat["messages"][-1]["content"] == huge
    assert [kind for kind, _ in upstream.learning_calls] == ["score", "extract"]
    for _, body in upstream.learning_calls:
        prompt = body["messages"][1]["content"]
        assert "I keep bees on my roof." in prompt
        assert "The end." in prompt
        kept = MAX_MESSAGE_CHARS - len(truncation_marker(len(huge)))
        assert truncation_marker(len(huge) - kept) in prompt
        assert len(prompt) < MAX_MESSAGE_CHARS + 2000


async def test_learning_calls_fit_a_small_window_learning_model(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """With a learning model of a 3000-token window, a long conversation is shown newest
    first as far as it fits: every call's prompt plus its max_tokens stays in the window."""
    window = 3000
    settings = make_settings(
        tmp_path,
        model_list=[
            {"model_name": "m", "litellm_params": {"model": "openai/up-model",
                                                   "api_base": "http://upstream.test/v1",
                                                   "api_key": "sk-upstream"},
             "model_info": {"max_input_tokens": 64000}},
            {"model_name": "small", "litellm_params": {"model": "openai/small-model",
                                                       "api_base": "http://upstream.test/v1",
                                                       "api_key": "sk-upstream"},
             "model_info": {"max_input_tokens": window}},
        ],
        learning={"enabled": True, "batch_messages": 1, "model": "small",
                  "max_output_tokens": 512},
    )
    history = [{"role": "user" if i % 2 == 0 else "assistant",
                "content": filler(3500, tag=f"turn{i}")} for i in range(9)]
    counter = TokenCounter()
    async with running_gateway(settings, upstream) as gateway:
        await chat(gateway, history)
        await gateway.settle()
    assert [kind for kind, _ in upstream.learning_calls] == ["score", "extract"]
    for _, body in upstream.learning_calls:
        assert body["model"] == "small-model"
        used = counter.count_messages(body["messages"], "cl100k_base") + body["max_tokens"]
        assert used <= window
        prompt = body["messages"][1]["content"]
        assert "turn8" in prompt  # the newest message is kept
        assert "turn0" not in prompt  # the oldest ones went


async def test_an_oversize_extracted_fact_is_rejected_and_the_rest_stored(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """Of one extraction, a fact longer than a manual memory may be is rejected (too_long,
    audited and counted), a normal one is stored."""
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1})
    long_fact = "Keeps bees on the roof" + " and keeps bees" * 400
    assert len(long_fact) > MAX_CONTENT_CHARS
    upstream.extract = lambda body: {"memories": [fact(long_fact),
                                                  fact("Keeps bees on the roof")]}
    async with running_gateway(settings, upstream) as gateway:
        await chat(gateway, [{"role": "user", "content": "I keep bees on the roof."}])
        await gateway.settle()
        assert await memories(gateway) == ["Keeps bees on the roof"]
        assert rejected(gateway, "too_long") == 1
        audit = [e for _, e in await gateway.res.store.audit_log("default", "u1")]
    assert [e.reason for e in audit if e.action == "rejected"] == ["too_long"]


def test_messages_are_cut_before_they_are_fingerprinted_and_buffered() -> None:
    """A 600 kB paste is kept (buffered, fingerprinted) as its clipped form: resent, it is
    the same message; changed at its end, it is another one."""
    from proxy.learning.exchange import transcript

    big = "lorem ipsum " * 50_000

    def first_message(text: str) -> Any:
        return transcript(tenant="t", user="u", messages=[{"role": "user", "content": text}],
                          reply="ok " * 3000, limit=10)

    once, again = first_message(big), first_message(big)
    assert len(once[0].text) <= MAX_MESSAGE_CHARS
    assert len(once[1].text) <= MAX_MESSAGE_CHARS  # the reply too
    assert once[0].fingerprint == again[0].fingerprint
    assert first_message(big + " the end")[0].fingerprint != once[0].fingerprint


async def test_a_window_too_small_for_any_of_the_conversation_is_reported(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """When the learning prompt and its reply fill the learning model's window at run time
    (here: the user's related memories listed in the prompt), no learning call is made
    with an empty transcript: the job fails, is dead-lettered with the reason (kept for a
    requeue once the model is fixed) and counted (``window_too_small``) so an operator can
    see the configuration problem; a window with room counts nothing of the kind and
    learns. (A window too small on the first attempt already stops startup:
    tests/learning/test_learning_model.py.)"""
    def setup(window: int) -> Any:
        return make_settings(
            tmp_path / str(window),
            model_list=[
                {"model_name": "m", "litellm_params": {"model": "openai/up-model",
                                                       "api_base": "http://upstream.test/v1",
                                                       "api_key": "sk-upstream"},
                 "model_info": {"max_input_tokens": window}}],
            learning={"enabled": True, "batch_messages": 1, "max_output_tokens": 1024,
                      "max_attempts": 1},
        )

    counts, dead, calls = {}, {}, {}
    for window in (2600, 64000):
        async with running_gateway(setup(window), upstream) as gateway:
            async with gateway.client(headers={"X-User-Id": "u1"}) as client:
                for n in range(12):
                    response = await client.post("/v1/memories", json={
                        "content": f"Keeps bees on the roof, hive {n}: " + " ".join(
                            f"bees{n}word{i}" for i in range(40))})
                    assert response.status_code == 201, response.text
            await chat(gateway, [{"role": "user", "content": "I keep bees on my roof."}])
            await gateway.settle()
            counter = gateway.res.metrics.learning_events.labels(
                event="transcript_cut", label="window_too_small")
            counts[window] = counter._value.get()
            assert gateway.res.queue is not None
            dead[window] = [d.last_error for d in await gateway.res.queue.dead_letters()]
            calls[window] = [kind for kind, _ in upstream.learning_calls]
            upstream.learning_calls.clear()
    assert counts[2600] >= 1
    assert len(dead[2600]) == 1
    assert "room for none of the conversation" in dead[2600][0]
    assert "extract" not in calls[2600]  # never a call that shows the model nothing
    assert counts[64000] == 0
    assert dead[64000] == []
    assert "extract" in calls[64000]
