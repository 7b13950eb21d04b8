"""The Chinese segmenter loads only when CJK text appears, and off the event loop."""

from __future__ import annotations

import threading

import pytest

from proxy.memory import text


async def test_loads_only_for_cjk_text_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Latin text leaves jieba unloaded; the first CJK text loads it, not on the loop."""
    loaded_on: list[str] = []
    real = text._segmenter

    def spy() -> object:
        loaded_on.append(threading.current_thread().name)
        return real()

    monkeypatch.setattr(text, "_jieba", None)
    monkeypatch.setattr(text, "_segmenter", spy)
    await text.load_segmenter_for("plain English", "no CJK here")
    assert not text.segmenter_loaded()
    assert loaded_on == []
    await text.load_segmenter_for("I like 拉面")
    assert loaded_on
    assert loaded_on[0] != threading.main_thread().name
    assert text.segmenter_loaded()

