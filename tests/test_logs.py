"""Log throttling for warnings that can fire on every request."""

from __future__ import annotations

from proxy.logs import LogThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_interval_per_key_with_the_count_held_back() -> None:
    clock = Clock()
    throttle = LogThrottle(10.0, clock=clock)
    assert throttle.allow("timeout") == 0  # the first occurrence is always logged
    assert [throttle.allow("timeout") for _ in range(5)] == [None] * 5
    assert throttle.allow("unavailable") == 0  # keys are independent
    clock.now += 9.9
    assert throttle.allow("timeout") is None
    clock.now += 0.1
    assert throttle.allow("timeout") == 6  # says how many lines were held back
    assert throttle.allow("timeout") is None
    clock.now += 60
    assert throttle.allow("timeout") == 1
    assert throttle.allow("unavailable") == 0
