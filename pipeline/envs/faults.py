"""A user's env that raises or hangs, as a worker meets it.

A fault is named by where it happened: `make` (building the env), `reset`, `step`, or `hang` (a
chunk or an evaluation ran past its time limit and was cut off). The worker ends that chunk at
once and reports the fault with it (pipeline/chunks/runtime.py) instead of failing its task, which
would leave the chunk to the learner's write-off after --lost-after-s.

`time_limit` cuts a block off with SIGALRM: Python code, sleeps and blocking I/O are interrupted
where they stand; a C call that holds the GIL is interrupted when it returns to Python (a call
that never returns is Celery's `task_time_limit`'s business: prefork then replaces the process).
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

import gymnasium as gym

FAULT_KINDS = ("make", "reset", "step", "hang")


def describe(exc: BaseException) -> str:
    """`Type: message`, short enough for a stream header and a log line."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


class EnvFault(Exception):
    """The env failed in `kind` (one of FAULT_KINDS); `error` says how."""

    def __init__(self, kind: str, error: str):
        super().__init__(f"env fault in {kind}: {error}")
        self.kind, self.error = kind, error

    def report(self) -> dict[str, str]:
        """What a chunk's header carries: {"kind": ..., "error": ...}."""
        return {"kind": self.kind, "error": self.error}


class NameFaults(gym.Wrapper):
    """Re-raises whatever the wrapped env's reset or step raises as EnvFault("reset"/"step"),
    so the vector env around it (whose autoreset calls reset from inside step) says which."""

    def reset(self, **kwargs: Any) -> Any:
        try:
            return self.env.reset(**kwargs)
        except Exception as exc:
            raise EnvFault("reset", describe(exc)) from exc

    def step(self, action: Any) -> Any:
        try:
            return self.env.step(action)
        except Exception as exc:
            raise EnvFault("step", describe(exc)) from exc


class TimeLimitHit(BaseException):
    """Raised into the code a `time_limit` cut off. A BaseException, as KeyboardInterrupt is:
    an env's own `except Exception` must not swallow it."""


class time_limit:
    """Raise TimeLimitHit into the block if it runs longer than `seconds`. A no-op for
    `seconds` <= 0 and off the main thread (SIGALRM reaches the main thread only: Celery's solo
    and prefork pools run tasks there, its threads pool does not). A timer already armed (say
    pytest-timeout's) runs on after the block with the time it had left; one due inside the
    block waits for its end."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.armed = False
        self._previous: Any = None
        self._outer = (0.0, 0.0)  # (delay, interval) of a timer armed before the block
        self._started = 0.0

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        # The block may have ended between the alarm and this handler: raise only inside it.
        if self.armed:
            raise TimeLimitHit(f"cut off after {self.seconds:g} s")

    def __enter__(self) -> time_limit:
        if self.seconds > 0 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGALRM, self._on_alarm)
            self.armed, self._started = True, time.monotonic()
            self._outer = signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.armed:
            self.armed = False  # first: an alarm from here on does nothing
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            delay, interval = self._outer
            if delay > 0:
                left = delay - (time.monotonic() - self._started)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), interval)


def hang_fault(limit_s: float) -> EnvFault:
    return EnvFault("hang", f"cut off after its time limit of {limit_s:g} s")
