"""Reply reassembly for the gateway's own records (pure)."""

from __future__ import annotations

from proxy.transcript import ReplyAssembler, reply_from_completion
from tests.fakes import chunk, text_chunks


def feed(chunks: list[dict]) -> ReplyAssembler:
    assembler = ReplyAssembler()
    for c in chunks:
        assembler.feed(c)
    return assembler


def test_parallel_calls_sharing_index_zero_stay_separate() -> None:
    """Two whole calls at index 0 with different ids are two calls. A public failure: a
    reassembler keyed on the index alone merged them into one call whose arguments were
    ``{..}{..}``, not JSON."""
    replies = feed([
        chunk([{"index": 0, "delta": {"role": "assistant", "tool_calls": [{
            "index": 0, "id": "call_a", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"City A\"}"}}]}}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "id": "call_b", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"City B\"}"}}]}}]),
        chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
    ]).replies()
    calls = replies[0].tool_calls
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_a", "get_weather", "{\"city\":\"City A\"}"),
        ("call_b", "get_weather", "{\"city\":\"City B\"}"),
    ]
    assert replies[0].finish_reason == "tool_calls"


def test_fragments_without_id_join_the_call_at_their_index() -> None:
    """Later fragments with ``id`` absent extend the call at their index (code that skipped
    fragments without an id dropped most argument deltas)."""
    calls = feed([
        chunk([{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "id": "call_x", "type": "function",
            "function": {"name": "lookup", "arguments": ""}}]}}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "id": None, "function": {"arguments": "{\"q\":"}}]}}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "function": {"arguments": "\"abc\"}"}}]}}]),
        chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
    ]).replies()[0].tool_calls
    assert [(c.id, c.name, c.arguments) for c in calls] == [("call_x", "lookup", "{\"q\":\"abc\"}")]


def test_parallel_calls_at_distinct_indices() -> None:
    """OpenAI's usual parallel calls (index 0 and 1, interleaved) stay apart."""
    calls = feed([
        chunk([{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{\"x\""}},
            {"index": 1, "id": "b", "function": {"name": "g", "arguments": "{\"y\""}}]}}]),
        chunk([{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "function": {"arguments": ":2}"}},
            {"index": 0, "function": {"arguments": ":1}"}}]}}]),
    ]).replies()[0].tool_calls
    assert [(c.id, c.arguments) for c in calls] == [("a", "{\"x\":1}"), ("b", "{\"y\":2}")]


def test_empty_arguments_become_an_empty_object() -> None:
    """A call streamed without arguments ends up as ``{}``."""
    calls = feed([chunk([{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "a", "function": {"name": "now"}}]}}])]).replies()[0].tool_calls
    assert calls[0].arguments == "{}"


def test_text_and_choices_are_reassembled() -> None:
    """Content of each choice is joined in order; multi-byte text survives."""
    assembler = feed(text_chunks("你好, мир! 🚀", pieces=4, n=2))
    replies = assembler.replies()
    assert replies[0].content == replies[1].content == "你好, мир! 🚀"
    assert assembler.finished


def test_unfinished_stream_is_not_finished() -> None:
    """Without a finish_reason the reply is not complete (it is never learned)."""
    assert not feed(text_chunks("partial")[:-1]).finished


def test_completion_body_is_read() -> None:
    """Non-streaming bodies give the same reply shape and usage."""
    replies, usage = reply_from_completion({
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    assert replies[0].content == "hi"
    assert usage is not None
    assert usage.total_tokens == 4
