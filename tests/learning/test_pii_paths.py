"""The new PII layouts are caught on both paths: before the learning model (the gateway's
writer scrubs turns before they are queued) and before storage of manual memories."""

from __future__ import annotations

import orjson
import pytest

from proxy.learning.privacy import Scrubbers
from proxy.learning.queue import NewJob
from proxy.learning.sink import QueueSink, Turn
from proxy.settings import PiiSettings
from tests.fakes import Gateway

LAYOUTS = [
    "My number is +44 7700 900123.",
    "Reach me at (555) 010-0147.",
    "My ID is 110101-19900307-7715.",
    "Mail alice＠example.com.",
    "Mail alice at example dot com.",
    "Key AKIA-IOSF-ODNN-7EXA-MPLE.",
    "Mail alice dot smith at example dot com.",
    "Key s k - p r o j - A b C d E f 0 1 2 3 4 5 6 7 8 9 G h I j K l.",
]


class Recorder:
    def __init__(self) -> None:
        self.jobs: list[NewJob] = []

    async def enqueue_many(self, jobs: list[NewJob]) -> None:
        self.jobs.extend(jobs)


async def test_turns_are_scrubbed_before_they_are_queued() -> None:
    """No queued message (what the learning model will read) holds any of the layouts."""
    queue = Recorder()
    sink = QueueSink(queue, Scrubbers(PiiSettings()), max_messages=20)
    for i, text in enumerate(LAYOUTS):
        sink.submit(Turn(tenant="t", user="u1", conversation=f"c{i}", channel="private",
                         group=None, model="m", messages=[{"role": "user", "content": text}],
                         reply="Noted.", at=1.0))
    await sink.flush()
    queued = [m["text"] for job in queue.jobs
              for m in orjson.loads(job.payload)["messages"] if m["role"] == "user"]
    assert len(queued) == len(LAYOUTS)
    for original, text in zip(LAYOUTS, queued, strict=True):
        assert text != original
        assert "[" in text
    assert not any(s in " ".join(queued) for s in ("7700", "010-0147", "19900307",
                                                  "example", "IOSF", "smith", "p r o j"))


@pytest.mark.parametrize("text", LAYOUTS)
async def test_a_manual_memory_with_the_layout_is_refused(gateway: Gateway, text: str) -> None:
    """POST /v1/memories refuses each layout with 400 ``pii_not_allowed``."""
    async with gateway.client(headers={"X-User-Id": "u1"}) as client:
        response = await client.post("/v1/memories", json={"content": text})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "pii_not_allowed"
