"""The clock of the lease-interrupt tests of the orchestrator surfaces (Airflow, Dagster): when a
lease was taken from outside, when the work saw ``LeaseLostInterrupt``, and that the take caused it."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from controltable import LeaseLostInterrupt

#: Long enough that the holder's own renewals (every INTERVAL) keep it through a loaded machine's
#: stalls: with 1.5 s a starved renewer let the lease run out, an interrupt with another cause (a CI run).
LEASE = 6.0
INTERVAL = LEASE / 3
#: The documented goal (one renewal interval plus a round trip and the delivery) lives in the
#: benchmarks (``benchmarks/run --only goals``): a test asserts what ended the work, not how soon.
GOAL = INTERVAL + 0.5
#: How long the work would run if nothing interrupted it: the hang detector, well over 5x the goal.
WORK_SECONDS = 20.0
assert WORK_SECONDS >= 5 * GOAL


class Clock:
    """When the lease was taken (from outside) and when the work saw the interrupt."""

    def __init__(self) -> None:
        self.taken: float = 0.0
        self.caught: float = 0.0
        self.error: Any = None

    def take_later(self, delay: float, take: Callable[[], Any]) -> threading.Thread:
        def run() -> None:
            time.sleep(delay)
            self.taken = time.monotonic()  # before the take: the interrupt may land before this thread runs again
            take()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def work(self) -> None:
        """Busy work in short Python steps (an async exception lands between bytecodes)."""
        end = time.monotonic() + WORK_SECONDS
        try:
            while time.monotonic() < end:
                time.sleep(0.01)
        except LeaseLostInterrupt as exc:
            self.caught, self.error = time.monotonic(), exc
            raise

    def assert_in_time(self) -> None:
        """The work was ended by the interrupt, and that interrupt was caused by the take.

        No bound on how soon: that is the benchmarks' (a loaded machine once stretched it to 3.7 s).
        The work itself is the hang detector: it runs WORK_SECONDS (over 5x the goal) unless interrupted.
        """
        assert isinstance(self.error, LeaseLostInterrupt), (
            f"hang: the work ran on {WORK_SECONDS:g} s (over 5x the {GOAL:g} s goal) after its lease was taken, "
            "never interrupted")
        assert self.taken, "interrupted before the lease was taken: the interrupt had another cause"
        assert self.caught >= self.taken, "interrupted before the take began"
        print(f"interrupted {self.caught - self.taken:.2f} s after the lease was taken (goal {GOAL:g} s)")
