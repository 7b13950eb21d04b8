"""Token counting with the target model's tokenizer, offline.

OpenAI models use tiktoken (``o200k_base`` for the GPT-4o/4.1/5 and o-series families,
``cl100k_base`` for GPT-4/3.5); Claude and DeepSeek use the Hugging Face tokenizer files
that litellm ships; other models fall back to ``cl100k_base`` (an approximation, so the
memory budget keeps a margin). tiktoken is pointed at litellm's bundled encoding files, so
nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from proxy.request import Message, message_text

# OpenAI's chat format overhead (openai-cookbook "How to count tokens with tiktoken"):
# 3 tokens per message, 1 per name, 3 priming the reply.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
# A high-detail image costs 85 + 170 per 512px tile; 765 tokens covers 1024x1024
# (OpenAI vision pricing guide). Used when the image size is unknown.
IMAGE_TOKENS = 765

_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o",
                   "gpt-oss", "codex")
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "text-embedding")


class Encoder(Protocol):
    def count(self, text: str) -> int: ...


class _Tiktoken:
    def __init__(self, encoding: Any) -> None:
        self._encoding = encoding
        # tiktoken keeps the vocabulary twice: in its Rust core (used to encode) and as a
        # Python dict of ~200k bytes → rank entries used only to pickle the Encoding. This
        # instance is ours alone (see TokenCounter._load) and never pickled: dropping the
        # dict saves ~27 MB per encoding (bench/gateway, o200k_base), counts unchanged.
        if isinstance(getattr(encoding, "_mergeable_ranks", None), dict):
            encoding._mergeable_ranks = {}

    def count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))


class _HFTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


def litellm_package_dir() -> Path | None:
    """litellm's install directory, found without importing it (import costs ~3 s)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def tokenizer_for(model: str, provider: str | None) -> str:
    """Tokenizer name for a model id (``o200k_base``, ``cl100k_base``, ``anthropic``,
    ``deepseek``)."""
    bare = model.rsplit("/", 1)[-1].lower()
    if provider in ("anthropic", "bedrock", "vertex_ai-anthropic_models") or "claude" in bare:
        return "anthropic"
    if provider == "deepseek" or bare.startswith("deepseek"):
        return "deepseek"
    if bare.startswith(_O200K_PREFIXES):
        return "o200k_base"
    if bare.startswith(_CL100K_PREFIXES):
        return "cl100k_base"
    return "cl100k_base"


# The tokenizers loaded so far, by name, shared by every counter of the process: a
# tokenizer never changes once built, and building one costs ~0.2 s of CPU (o200k_base,
# cl100k_base) — paid once, not by each counter (preflight's and the gateway's at startup,
# or every gateway a test starts in one process).
_LOADED: dict[str, Encoder] = {}
_LOADED_LOCK = threading.Lock()


class TokenCounter:
    """Loads tokenizers on first use (thread-safe, once per process) and counts tokens."""

    def __init__(self) -> None:
        package = litellm_package_dir()
        self._bundle = package / "litellm_core_utils" / "tokenizers" if package else None
        if self._bundle is not None and "TIKTOKEN_CACHE_DIR" not in os.environ:
            # tiktoken looks up its cache dir at encode-load time; litellm ships the
            # o200k/cl100k files there, so no network access is needed.
            os.environ["TIKTOKEN_CACHE_DIR"] = str(self._bundle)

    def encoder(self, name: str) -> Encoder:
        found = _LOADED.get(name)
        if found is not None:
            return found
        with _LOADED_LOCK:
            found = _LOADED.get(name)
            if found is None:
                found = self._load(name)
                _LOADED[name] = found
        return found

    def _load(self, name: str) -> Encoder:
        if name in ("anthropic", "deepseek") and self._bundle is not None:
            path = self._bundle / f"{name}_tokenizer.json"
            if path.is_file():
                from tokenizers import Tokenizer

                return _HFTokenizer(Tokenizer.from_file(str(path)))
            name = "cl100k_base"
        return _Tiktoken(_own_encoding(name))

    def count(self, text: str, tokenizer: str) -> int:
        return self.encoder(tokenizer).count(text)

    def count_messages(self, messages: Iterable[Message], tokenizer: str) -> int:
        """Prompt tokens of a message list in OpenAI's chat format (text and images)."""
        encoder = self.encoder(tokenizer)
        total = REPLY_PRIMING_TOKENS
        for message in messages:
            total += TOKENS_PER_MESSAGE + encoder.count(message_text(message))
            if message.get("name"):
                total += TOKENS_PER_NAME + encoder.count(str(message["name"]))
            content = message.get("content")
            if isinstance(content, list):
                total += IMAGE_TOKENS * sum(
                    1 for p in content if isinstance(p, dict) and p.get("type") == "image_url"
                )
            for call in message.get("tool_calls") or ():
                if isinstance(call, dict):
                    function = call.get("function") or {}
                    total += encoder.count(str(function.get("name", "")))
                    total += encoder.count(str(function.get("arguments", "")))
        return total


def _own_encoding(name: str) -> Any:
    """A tiktoken ``Encoding`` built for the counters, not the one tiktoken's registry
    shares with the rest of the process (so trimming it cannot affect anyone else).
    Unknown names fall back to ``cl100k_base``."""
    import tiktoken
    from tiktoken import registry

    try:
        tiktoken.list_encoding_names()  # makes tiktoken discover its constructors
        constructors = registry.ENCODING_CONSTRUCTORS or {}
        constructor = constructors.get(name) or constructors["cl100k_base"]
    except (AttributeError, KeyError, ValueError):
        try:
            return tiktoken.get_encoding(name)
        except ValueError:
            return tiktoken.get_encoding("cl100k_base")
    return tiktoken.Encoding(**constructor())


def upper_bound_tokens(messages: Iterable[Message]) -> int:
    """A cheap upper bound of prompt tokens without tokenizing: the byte-level BPE
    tokenizers in use never produce more tokens than UTF-8 bytes, so bytes (plus per-message
    overhead) bound the count from above. Used to skip exact counting when the prompt is
    clearly far from the context window.
    """
    total = REPLY_PRIMING_TOKENS
    for message in messages:
        total += TOKENS_PER_MESSAGE + len(message_text(message).encode()) + 8
        content = message.get("content")
        if isinstance(content, list):
            total += IMAGE_TOKENS * len(content)
        for call in message.get("tool_calls") or ():
            total += len(str(call).encode())
    return total
