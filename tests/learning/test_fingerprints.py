"""Message fingerprints keyed with a deployment secret (docs/design.md#erasure): the key
comes from ``learning.fingerprint_key`` or a generated 0600 file next to the SQLite
database; rotation and old unkeyed stores never make resent history learned twice."""

from __future__ import annotations

import hashlib
import hmac
import stat
from pathlib import Path

import pytest

from proxy.learning.exchange import fingerprint_seed, transcript
from proxy.learning.fingerprints import UNKEYED, Fingerprinter, key_file_for
from proxy.learning.queue import LearningQueue
from proxy.resources import configured_fingerprints, preflight
from proxy.settings import ConfigError
from tests.fakes import make_settings
from tests.learning.test_queue_contract import exchange, queue  # noqa: F401 - fixture

KEY_A, KEY_B = b"a" * 32, b"b" * 32
HISTORY = [{"role": "user", "content": "I sail on weekends"},
           {"role": "assistant", "content": "Nice!"},
           {"role": "user", "content": "Where should I go?"}]


def test_a_fingerprint_is_hmac_sha256_under_the_key() -> None:
    """HMAC-SHA256 of the fingerprinted text under the key, 32 hex digits; another key or
    no key gives another value, so a copy of the store alone cannot confirm a guessed
    sentence."""
    seed = fingerprint_seed(tenant="t", user="u", role="user", text="I sail")
    keyed = Fingerprinter(KEY_A)
    assert keyed(seed) == hmac.new(KEY_A, seed.encode(), hashlib.sha256).hexdigest()[:32]
    assert keyed(seed) != Fingerprinter(KEY_B)(seed)
    assert keyed(seed) != UNKEYED(seed) == hashlib.sha256(seed.encode()).hexdigest()[:32]
    assert Fingerprinter(KEY_B, [KEY_A]).aliases(seed) == (keyed(seed), UNKEYED(seed))
    assert UNKEYED.aliases(seed) == ()


def test_unset_key_with_sqlite_generates_a_0600_file_next_to_the_database(
        tmp_path: Path) -> None:
    """The first start writes the key file (mode 0600) beside the database; the next
    start reads the same key; a configured key wins over the file."""
    settings = make_settings(tmp_path, learning={"enabled": True})
    path = key_file_for(settings.storage.path)
    assert path.parent == settings.storage.path.parent
    seed = fingerprint_seed(tenant="t", user="u", role="user", text="x")
    first = configured_fingerprints(settings, key_file=path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert configured_fingerprints(settings, key_file=path)(seed) == first(seed)
    assert first(seed) != UNKEYED(seed)
    keyed = make_settings(tmp_path, learning={"enabled": True,
                                              "fingerprint_key": "k" * 20})
    assert configured_fingerprints(keyed, key_file=path)(seed) == \
        Fingerprinter(b"k" * 20)(seed)


def test_the_key_setting_reads_the_environment_and_refuses_short_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FP_KEY", "s" * 24)
    settings = make_settings(tmp_path, learning={"fingerprint_key": "os.environ/FP_KEY"})
    assert settings.learning.fingerprint_key is not None
    assert settings.learning.fingerprint_key.get_secret_value() == "s" * 24
    for bad in ("short", "os.environ/FP_KEY_NOT_SET"):
        with pytest.raises(ConfigError, match="fingerprint_key"):
            make_settings(tmp_path, learning={"fingerprint_key": bad})


def test_redis_with_learning_and_no_key_is_refused_at_startup(tmp_path: Path) -> None:
    """No key kept in Redis beside the fingerprints, none generated per pod: preflight
    refuses; with a key (or learning off) it starts."""
    storage = {"backend": "redis", "url": "redis://127.0.0.1:1/0"}
    with pytest.raises(ConfigError, match=r"learning\.fingerprint_key"):
        preflight(make_settings(tmp_path, storage=storage, learning={"enabled": True}))
    preflight(make_settings(tmp_path, storage=storage,
                            learning={"enabled": True, "fingerprint_key": "k" * 20}))
    preflight(make_settings(tmp_path, storage=storage))


async def _buffered(queue: LearningQueue, keys: Fingerprinter, at: float) -> int:  # noqa: F811
    messages = transcript(tenant="t1", user="u1", messages=HISTORY, reply="Try Crete",
                          limit=40, conversation="c1", keys=keys)
    history = tuple(m for m in messages if not m.new)  # resent history only
    await queue.buffer(exchange(history, at=at), batch_size=99, now=at)
    batch = await queue.load_batch(await queue.seal("t1", "u1", "c1", now=at) or "")
    return 0 if batch is None else len(batch.messages)


async def test_history_resent_after_a_rotation_is_not_learned_twice(
        queue: LearningQueue) -> None:  # noqa: F811
    """History buffered under key A, resent under key B with A kept as a previous key:
    nothing is buffered again; an old unkeyed store's history is recognised too. Without
    the previous key (negative case) the same history is new."""
    assert await _buffered(queue, Fingerprinter(KEY_A), 1000) == 3
    assert await _buffered(queue, Fingerprinter(KEY_B, [KEY_A]), 1001) == 0
    assert await _buffered(queue, Fingerprinter(KEY_B), 1002) == 0  # now seen under B
    assert await _buffered(queue, Fingerprinter(b"c" * 32), 1003) == 3  # A, B not kept


async def test_an_unkeyed_store_dedupes_after_keying(queue: LearningQueue) -> None:  # noqa: F811
    """History fingerprinted before keying (unkeyed SHA-256) is recognised by the keyed
    fingerprinter through its unkeyed alias."""
    assert await _buffered(queue, UNKEYED, 1000) == 3
    assert await _buffered(queue, Fingerprinter(KEY_A), 1001) == 0
