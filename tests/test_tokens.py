"""Token counts come from the model's tokenizer; the counter's trimmed copy counts the same
and leaves tiktoken's shared encoding as it was."""

from __future__ import annotations

import pytest
import tiktoken

from proxy.tokens import TokenCounter

TEXTS = ["hello world", "User likes ramen in Lisbon.", "我喜欢在里斯本吃拉面",
         "<|endoftext|> is not special here", "x" * 2000, ""]


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_counts_equal_tiktokens_own(name: str) -> None:
    counter = TokenCounter()
    shared = tiktoken.get_encoding(name)
    for text in TEXTS:
        assert counter.count(text, name) == len(shared.encode(text, disallowed_special=()))
    assert shared._mergeable_ranks  # the registry's encoding keeps its vocabulary


def test_unknown_tokenizer_falls_back_to_cl100k() -> None:
    counter = TokenCounter()
    assert counter.count("hello world", "no-such-encoding") == \
        counter.count("hello world", "cl100k_base")


def test_a_tokenizer_is_loaded_once_per_process() -> None:
    """Every counter uses the one tokenizer the process loaded (building one costs ~0.2 s;
    preflight and the gateway, or the gateways of one test process, each have a counter)."""
    first, second = TokenCounter(), TokenCounter()
    assert first.encoder("cl100k_base") is second.encoder("cl100k_base")
    assert first.encoder("o200k_base") is not first.encoder("cl100k_base")
