"""Algorithms and their state: replay, DQN, rate limiter, evaluation, checkpoints; and `main`,
the `clusterenv` command, which also answers on an install without the `learner` extra."""

import os
import sys
from importlib.metadata import version

# Before numpy loads, as clusterenv.tasks does for workers: the learner's numpy matmuls (the
# publisher's probe, 256 states per version) are small, and after each one an idle OpenBLAS
# thread spins for a while; at a version every ~0.1 s it spun all the time and took most of a
# core from the workers and the broker (CartPole run, per-thread CPU: 6.5 s of 12 s).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# The `learner` extra (pyproject.toml): a worker's base install has none of these.
LEARNER_EXTRA = ("torch", "tqdm", "matplotlib", "tyro")


def main() -> int:
    """`clusterenv`: the CLI, or a one-line hint where the learner's dependencies are missing."""
    try:
        from clusterenv.learner.tools.cli import main as cli
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in LEARNER_EXTRA:
            raise
        if sys.argv[1:] == ["--version"]:
            print(f"clusterenv {version('clusterenv')} (without the learner extra)")
            return 0
        print(
            f"clusterenv: error: {exc.name} is not installed; the learner needs the `learner` "
            "extra: pip install 'clusterenv[learner]'",
            file=sys.stderr,
        )
        return 2
    return cli()
