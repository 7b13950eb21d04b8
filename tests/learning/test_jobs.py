"""Job payloads: each kind is built and read in one place, and the bytes are exactly the
ones earlier versions queued (a job waiting in the queue across an upgrade still parses)."""

from __future__ import annotations

import orjson
import pytest

from proxy.learning.exchange import Exchange, TranscriptMessage
from proxy.learning.jobs import (
    Flush,
    blank_exchange,
    exchange_job,
    flush_job,
    learn_job,
    names_user,
    read_exchange,
    read_learn,
)
from proxy.learning.queue import NewJob


def _exchange(speaker: str | None = None) -> Exchange:
    return Exchange(
        id="x1", tenant="t", user="u", conversation="c", channel="private", group=None,
        model="m", at=12.5, speaker=speaker, speaker_name=None,
        messages=(TranscriptMessage(role="user", text="hi", fingerprint="f1", name=None,
                                    images=("data:x",)),),
    )


def test_an_exchange_job_has_todays_bytes_and_reads_back() -> None:
    """The exchange payload is the turn's JSON, key for key as before; it round-trips."""
    exchange = _exchange()
    job = exchange_job(exchange)
    assert job == NewJob("exchange", "exchange:x1", job.payload, "t")
    assert job.payload == (
        b'{"id":"x1","tenant":"t","user":"u","conversation":"c","channel":"private",'
        b'"group":null,"model":"m","messages":[{"role":"user","text":"hi","fp":"f1",'
        b'"name":null,"images":["data:x"]}],"at":12.5,"speaker":null,"speaker_name":null}')
    assert read_exchange(job.payload) == exchange


def test_an_explicit_flush_names_no_conversation() -> None:
    """The explicit flush: ``{"tenant","user"}``, every buffered conversation."""
    job = flush_job(Flush("t", "u"), unique="abc")
    assert job == NewJob("flush", "flush:t:u:abc", b'{"tenant":"t","user":"u"}', "t")
    assert Flush.from_bytes(job.payload) == Flush("t", "u", None)


def test_an_idle_flush_is_named_by_its_conversation_only() -> None:
    """The idle flush: the conversation in the payload and the id, no time in the id (one
    id per conversation, so a queue holding it ignores another)."""
    job = flush_job(Flush("t", "u", "c"))
    assert job == NewJob("flush", "flush:t:u:c",
                         b'{"tenant":"t","user":"u","conversation":"c"}', "t")
    assert Flush.from_bytes(job.payload) == Flush("t", "u", "c")


def test_a_learn_job_carries_its_batch_key() -> None:
    """One learn job per batch: id and payload from the batch key."""
    job = learn_job("b_1", "t")
    assert job == NewJob("learn", "learn:b_1", b'{"batch":"b_1"}', "t")
    assert read_learn(job.payload) == "b_1"


@pytest.mark.parametrize("payload", [b'{"tenant":"t"}', b'{"user":"u"}'])
def test_a_flush_without_tenant_or_user_does_not_parse(payload: bytes) -> None:
    """A malformed flush payload fails (the job is retried, then dead-lettered)."""
    with pytest.raises(KeyError):
        Flush.from_bytes(payload)


def test_a_learn_payload_without_a_batch_does_not_parse() -> None:
    """A learn payload without its key fails."""
    with pytest.raises(KeyError):
        read_learn(b"{}")


def test_blank_exchange_empties_the_owners_and_the_speakers_jobs() -> None:
    """The job is blanked for its owner and for its group speaker, not for others: no
    message (text, image or fingerprint) and no display name stays."""
    import dataclasses

    payload = exchange_job(dataclasses.replace(_exchange("s"), speaker_name="Sam")).payload
    for user in ("u", "s"):
        blank = blank_exchange(payload, "t", user)
        assert blank is not None
        scrubbed = read_exchange(blank)
        assert scrubbed.messages == ()
        assert scrubbed.speaker_name is None
        assert b"Sam" not in blank
        assert blank_exchange(blank, "t", user) is None  # already blank
    assert blank_exchange(payload, "t", "other") is None
    assert blank_exchange(payload, "t2", "u") is None


@pytest.mark.parametrize("payload", [b"not json", b'{"batch":"b"}',
                                     orjson.dumps({"tenant": "t", "user": "u"})])
def test_blank_exchange_leaves_other_payloads(payload: bytes) -> None:
    """A payload that is not an exchange is never rewritten."""
    assert blank_exchange(payload, "t", "u") is None


_SPOKEN = exchange_job(_exchange("s")).payload


@pytest.mark.parametrize(("kind", "payload", "tenant", "user", "named"), [
    ("exchange", _SPOKEN, "t", "u", True),  # the learning owner
    ("exchange", _SPOKEN, "t", "s", True),  # the group speaker
    ("exchange", _SPOKEN, "t", "other", False),
    ("exchange", _SPOKEN, "t2", "u", False),  # same user id, another tenant
    ("flush", Flush("t", "u").to_bytes(), "t", "u", True),  # explicit
    ("flush", Flush("t", "u", "c").to_bytes(), "t", "u", True),  # idle
    ("flush", Flush("t", "u", "c").to_bytes(), "t", "v", False),
    ("flush", Flush("t", "u", "c").to_bytes(), "t2", "u", False),
    ("learn", learn_job("b_1", "t").payload, "t", "u", False),  # names a batch only
    ("exchange", b"not json", "t", "u", False),
    ("flush", b"[1, 2]", "t", "u", False),
])
def test_names_user_matches_the_users_exchanges_and_flushes_only(
        kind: str, payload: bytes, tenant: str, user: str, named: bool) -> None:
    """An exchange names its owner and its speaker, a flush its user, within the
    tenant; a learn job or a payload of another shape names nobody."""
    assert names_user(kind, payload, tenant, user) is named
