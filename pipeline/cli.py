"""`clusterenv` command line: `train` (flags derived from TrainConfig) and `report`."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
import types
import typing
import uuid
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from learner.config import TrainConfig

WORKER_HINT = "CLUSTERENV_REDIS_URL={url} celery -A tasks worker --loglevel=INFO"


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag costs one line, not the whole usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _arg_type(annotation: Any):
    """The argparse `type` for a TrainConfig field annotation (str, int, float, dict, X | None)."""
    hints = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    base = next((h for h in hints if h is not type(None)), annotation)
    if typing.get_origin(base) is dict or base is dict:
        return _json_object
    return base


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            type=_arg_type(hints[f.name]),
            default=default,
            help=f"{f.metadata['help']} (default: {json.dumps(default) if isinstance(default, dict) else default})",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="clusterenv",
        description="Distributed DQN: envs on Celery workers, transitions via Redis, one learner.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train",
        help="train Double DQN (embedded server and local workers unless --redis-url)",
        description=(
            "Train Double DQN. Without --redis-url, starts an embedded Redis-compatible server and "
            "one local celery worker per core. With --redis-url, uses the workers attached to that "
            "broker (start them with: "
            + WORKER_HINT.format(url="URL")
            + ") plus --workers local ones."
        ),
    )
    add_config_flags(train)
    report = sub.add_parser("report", help="plots and a table from one or more run directories")
    report.add_argument("run_dirs", nargs="+", type=Path, help="run directories written by train")
    report.add_argument(
        "--out", type=Path, default=Path("report"), help="output folder (default: report)"
    )
    report.add_argument(
        "--target",
        type=float,
        default=None,
        help="return that counts as solved in the steps-to-target column "
        "(default: each run's own --target-return)",
    )
    return parser


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def train(cfg: TrainConfig) -> int:
    from learner.trainer import Trainer, env_spaces
    from pipeline.connect import RedisUnreachable, connect
    from pipeline.embedded import Stack

    try:
        cfg.validate()
        env_spaces(cfg)
    except ValueError as exc:
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
            print(f"run {run_id}: broker {url}, run dir {run_dir}", file=sys.stderr)
            result = Trainer(cfg, url, run_dir, run_id).run()
    except RedisUnreachable as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        print(f"interrupted; partial run in {run_dir}", file=sys.stderr)
        return 130
    status = "solved" if result.solved else "budget spent"
    print(
        f"{status}: best eval {result.best_eval:.1f} after {result.env_steps} env steps, "
        f"{result.updates} updates, {result.wall_s:.1f} s; run dir {run_dir}",
        file=sys.stderr,
    )
    return 0


def _wait_for_workers(client, url: str, timeout_s: float = 600.0) -> None:
    from pipeline.embedded import alive_worker_processes

    if alive_worker_processes(client) > 0:
        return
    print(
        f"waiting for workers on {url}; start one with:\n  {WORKER_HINT.format(url=url)}",
        file=sys.stderr,
    )
    deadline = time.monotonic() + timeout_s
    while alive_worker_processes(client) == 0:
        if time.monotonic() > deadline:
            raise CliError(f"no worker attached to {url} within {timeout_s:.0f} s")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "train":
            values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
            return train(TrainConfig(**values))
        if args.command == "report":
            from pipeline.report import write_report

            try:
                print(write_report(args.run_dirs, args.out, args.target))
            except ValueError as exc:
                raise CliError(str(exc)) from None
            print(f"plots and report.md in {args.out}", file=sys.stderr)
            return 0
    except CliError as exc:
        print(f"clusterenv: error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
