"""`clusterenv` command line: `train` (flags derived from TrainConfig by tyro) and `report`."""

from __future__ import annotations

import logging
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import tyro

from learner.config import TrainConfig

WORKER_HINT = "CLUSTERENV_REDIS_URL={url} celery -A tasks worker --loglevel=INFO"
USAGE = """usage: clusterenv {train,report} [--help] | --version

  train    train Double DQN (embedded server and local workers unless --redis-url)
  report   plots and a table from one or more run directories
"""
# Nested configs give flat flags (`--lr`, not `--dqn.lr`).
FLAT = (tyro.conf.OmitArgPrefixes,)


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


@dataclass
class ReportArgs:
    """Plots (eval vs steps and time, weight bytes, lag) and a markdown table from run directories."""

    run_dirs: tyro.conf.Positional[list[Path]]
    """run directories written by `clusterenv train`"""
    out: Path = Path("report")
    """output folder"""
    target: float | None = None
    """return that counts as solved in the steps-to-target column; unset: each run's own target"""


def _one_line_parse_errors(event: Any) -> None:
    """tyro's parse-error hook: a bad flag costs one line, not a box of help."""
    flags = getattr(getattr(getattr(event, "argument", None), "lowered", None), "name_or_flags", ())
    where = f"{flags[0]}: " if flags else ""
    if isinstance(event, tyro._errors.UnrecognizedArgs):
        raise CliError(f"unrecognized arguments: {' '.join(event.tokens)}")
    if isinstance(event, tyro._errors.InstantiationFailure):
        raise CliError(f"{where}{event.message}")
    if isinstance(event, tyro._errors.InvalidChoice):
        raise CliError(f"{where}{event.value!r} is not one of {', '.join(event.choices)}")
    if isinstance(event, tyro._errors.BadValue):
        raise CliError(f"{where}bad or missing value {event.offending_value or ''}".rstrip())
    if isinstance(event, tyro._errors.MissingArgs):
        raise CliError("missing required arguments")
    # Anything else: tyro's own message.


def parse(kind: type, argv: list[str], prog: str) -> Any:
    with tyro._errors.on_parse_error(_one_line_parse_errors):
        return tyro.cli(kind, args=argv, prog=prog, config=FLAT)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def train(cfg: TrainConfig) -> int:
    from learner.envs import env_spaces
    from learner.trainer import RunFailed, Trainer
    from pipeline.cluster.embedded import Stack
    from pipeline.connect import RedisUnreachable, connect, redact

    try:
        cfg.validate()
        env_spaces(cfg.env, cfg.env_kwargs)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if cfg.redis_url is not None:
        try:  # before the run directory exists: a typo in the URL leaves nothing behind
            connect(cfg.redis_url).close()
        except RedisUnreachable as exc:
            raise CliError(str(exc)) from None
    run_id = f"{cfg.env.replace('/', '_')}__s{cfg.seed}__{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    run_dir = Path(cfg.run_dir) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    # SIGTERM and SIGHUP (a closed terminal) take the same clean path as Ctrl-C: workers and
    # the embedded server are stopped. The server has no parent-death signal of its own. A signal
    # the run was started ignoring (`nohup` ignores SIGHUP) stays ignored, as the caller asked.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _raise_keyboard_interrupt)
    try:
        with Stack(cfg.redis_url, cfg.local_workers(), log_path=run_dir / "workers.log") as stack:
            url = stack.redis_url
            assert url is not None
            _wait_for_workers(connect(url), url)
            print(f"run {run_id}: broker {redact(url)}, run dir {run_dir}", file=sys.stderr)
            result = Trainer(cfg, url, run_dir, run_id).run()
    except RedisUnreachable as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        print(f"interrupted; partial run in {run_dir}", file=sys.stderr)
        return 130
    except RunFailed as exc:
        print(f"clusterenv: run failed: {exc}; partial run in {run_dir}", file=sys.stderr)
        return 1
    status = "solved" if result.solved else "budget spent"
    print(
        f"{status}: best eval {result.best_eval:.1f} after {result.env_steps} env steps, "
        f"{result.updates} updates, {result.wall_s:.1f} s; run dir {run_dir}",
        file=sys.stderr,
    )
    return 0


def _wait_for_workers(client, url: str, timeout_s: float = 600.0) -> None:
    from pipeline.cluster.registry import WorkerRegistry
    from pipeline.connect import redact

    url = redact(url)  # the hint shows where the password goes, never the password
    registry = WorkerRegistry(client)
    if registry.alive_processes() > 0:
        return
    print(
        f"waiting for workers on {url}; start one with:\n  {WORKER_HINT.format(url=url)}",
        file=sys.stderr,
    )
    deadline = time.monotonic() + timeout_s
    while registry.alive_processes() == 0:
        if time.monotonic() > deadline:
            raise CliError(f"no worker attached to {url} within {timeout_s:.0f} s")
        time.sleep(0.5)


def report(args: ReportArgs) -> int:
    from learner.report import write_report

    if not args.run_dirs:
        raise CliError("report needs at least one run directory")
    try:
        print(write_report(args.run_dirs, args.out, args.target))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(f"plots and report.md in {args.out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    try:
        if command == "train":
            return train(parse(TrainConfig, rest, "clusterenv train"))
        if command == "report":
            return report(parse(ReportArgs, rest, "clusterenv report"))
        if command in ("-h", "--help"):
            print(USAGE, end="")
            return 0
        if command == "--version":
            print(f"clusterenv {version('clusterenv')}")
            return 0
        raise CliError(
            f"unknown command {command!r}; choose train or report"
            if command
            else "no command given"
        )
    except CliError as exc:
        print(
            f"clusterenv: error: {exc} (see clusterenv {command or ''} --help)".replace("  ", " "),
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
