"""What a person watching the run sees: a tqdm bar on a terminal, a line per eval without one."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tqdm import tqdm


class Progress:
    def __init__(self, total_steps: int):
        self.total = total_steps
        self.interactive = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.bar = tqdm(
            total=total_steps, unit="step", dynamic_ncols=True, disable=not self.interactive
        )

    def tick(
        self, env_steps: int, last_eval: float, version: int, fetches: Callable[[], int]
    ) -> None:
        """Refresh the bar; `fetches` (a sum over every worker's counters) is only called for it."""
        if not self.interactive:
            return
        self.bar.n = min(env_steps, self.total)
        self.bar.set_postfix(
            sps=f"{env_steps / max(1e-9, time.perf_counter() - self.t0):.0f}",
            eval=f"{last_eval:.0f}", v=version, fetches=fetches(), refresh=False,
        )  # fmt: skip
        self.bar.refresh()

    def evaluated(self, env_steps: int, mean_return: float, version: int, wall_s: float) -> None:
        if not self.interactive:
            print(
                f"steps {env_steps:>7d}  eval {mean_return:7.1f}  v{version}  {wall_s:6.1f}s",
                file=sys.stderr, flush=True,
            )  # fmt: skip

    def close(self) -> None:
        self.bar.close()
