"""What a person watching the run sees: a tqdm bar on a terminal; without one (a log file, CI,
`nohup`), a line per evaluation and a status line every `status_every_s` seconds. The same
figures go to the broker every few seconds for `clusterenv status` (learner/run/status.py)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

from tqdm import tqdm

from clusterenv.learner.run.status import RunStatus


class Progress:
    def __init__(
        self, total_steps: int, status_every_s: float = 30.0, board: RunStatus | None = None
    ):
        self.total, self.status_every_s, self.board = total_steps, status_every_s, board
        self.interactive = sys.stderr.isatty()
        self.t0 = self._status_at = time.perf_counter()
        self.bar = tqdm(
            total=total_steps, unit="step", dynamic_ncols=True, disable=not self.interactive
        )

    def tick(
        self, env_steps: int, last_eval: float, version: int, fetches: Callable[[], int]
    ) -> None:
        """Refresh the bar, or print a status line when one is due; `fetches` (a sum over every
        worker's counters) is only called then."""
        now = time.perf_counter()
        sps = env_steps / max(1e-9, now - self.t0)
        if self.board is not None and self.board.due():
            self.board.running({
                "env_steps": env_steps, "total_steps": self.total, "steps_per_s": round(sps, 1),
                "last_eval": last_eval if math.isfinite(last_eval) else None,
                "policy_version": version, "weight_fetches": fetches(),
                "wall_s": round(now - self.t0, 1),
            })  # fmt: skip
        if self.interactive:
            self.bar.n = min(env_steps, self.total)
            self.bar.set_postfix(
                sps=f"{sps:.0f}", eval=f"{last_eval:.0f}", v=version, fetches=fetches(),
                refresh=False,
            )  # fmt: skip
            self.bar.refresh()
        elif now - self._status_at >= self.status_every_s:
            self._status_at = now
            print(
                f"status: steps {env_steps}/{self.total}  {sps:.0f} steps/s  eval {last_eval:.1f}  "
                f"v{version}  weight fetches {fetches()}  {now - self.t0:.0f}s",
                file=sys.stderr, flush=True,
            )  # fmt: skip

    def evaluated(self, env_steps: int, mean_return: float, version: int, wall_s: float) -> None:
        if not self.interactive:
            print(
                f"steps {env_steps:>7d}  eval {mean_return:7.1f}  v{version}  {wall_s:6.1f}s",
                file=sys.stderr, flush=True,
            )  # fmt: skip

    def close(self) -> None:
        self.bar.close()
