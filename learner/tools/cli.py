"""`clusterenv` command line: `train` (flags derived from TrainConfig by tyro), `eval`, `report`,
`status`."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import tyro

from clusterenv.learner.config import TrainConfig

if TYPE_CHECKING:
    from clusterenv.learner.persistence.resume import Resumed
    from clusterenv.learner.run.prometheus import MetricsServer

WORKER_HINT = "CLUSTERENV_REDIS_URL={url} celery -A clusterenv.tasks worker --loglevel=INFO"
USAGE = """usage: clusterenv {train,eval,report,status} [--help] | --version

  train    train Double DQN or PPO (embedded server and local workers unless --redis-url)
  eval     greedy return of a checkpoint or run directory, mean ± std over episodes; MP4s
  report   plots and a table from one or more run directories
  status   the progress of the runs on a broker, as their learners last wrote it
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
    target: Annotated[
        float | None, tyro.conf.arg(help_behavior_hint="(default: each run's own target)")
    ] = None
    """return that counts as solved in the steps-to-target column"""


@dataclass
class EvalArgs:
    """Greedy return of a saved policy (DQN's Q-network or PPO's actor), mean ± std over episodes
    run on this machine.

    The env is the run's (its config.json). MP4s with --video need `pip install 'clusterenv[video]'`.
    """

    checkpoint: tyro.conf.Positional[Path]
    """a .safetensors checkpoint (RUN_DIR/best.safetensors: the best-evaluated network), or a run directory (its final.safetensors, else the newest in checkpoints/)"""
    episodes: int = 10
    """greedy episodes to run"""
    seed: int = 0
    """episode i is reset with seed + i"""
    video: Annotated[Path | None, tyro.conf.arg(help_behavior_hint="(default: no video)")] = None
    """folder for one MP4 per episode (gymnasium's RecordVideo; the env needs an rgb_array render mode)"""


@dataclass
class StatusArgs:
    """The progress of every run on a broker (steps, steps/s, eval, version, state), as each
    learner wrote it in the last few seconds."""

    redis_url: Annotated[
        str | None,
        tyro.conf.arg(help_behavior_hint="(default: $CLUSTERENV_REDIS_URL, else the local one)"),
    ] = None
    """the broker the runs use (an embedded run prints its URL when it starts)"""
    json: bool = False
    """print the statuses as one JSON list instead of a line per run"""


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


def parse(kind: type, argv: list[str], prog: str, default: Any = None) -> Any:
    with tyro._errors.on_parse_error(_one_line_parse_errors):
        return tyro.cli(kind, args=argv, prog=prog, config=FLAT, default=default)


def parse_train(argv: list[str]) -> TrainConfig:
    """The run's config: flags on top of the env's preset (learner/tools/presets.toml) or the plain
    defaults; with --resume, on top of the resumed run's config, where flags not given keep its
    values and a flag that would change what may not change is refused."""
    from clusterenv.learner.persistence.resume import check_overrides, saved_config
    from clusterenv.learner.tools.presets import defaults_for, preset_choice

    try:
        # The agent's own settings are flags too: parse with its config's type (tyro needs it).
        defaults = defaults_for(*preset_choice(argv))
        cfg = parse(TrainConfig[type(defaults.agent)], argv, "clusterenv train", defaults)
        if cfg.resume is None:
            return cfg
        saved = saved_config(Path(cfg.resume))
        saved.resume = cfg.resume
        cfg = parse(TrainConfig[type(saved.agent)], argv, "clusterenv train", default=saved)
        check_overrides(saved, cfg)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return cfg


class Interrupted(KeyboardInterrupt):
    """What a stop signal raises in `clusterenv train`. A subclass, not KeyboardInterrupt itself:
    CPython remembers a bare KeyboardInterrupt raised inside exec()'d code (dataclasses and
    namedtuples are built that way, so any late import) and, under `python -m`, then ends the
    process by SIGINT instead of with the exit code the CLI returns."""


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal) raise Interrupted in the main thread, so
    each takes the clean path of Ctrl-C. A signal the process was started ignoring (`nohup`
    ignores SIGHUP) stays ignored, as the caller asked."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _raise_interrupted)


def train(cfg: TrainConfig) -> int:
    from clusterenv.learner.run.loop import Run, RunFailed
    from clusterenv.learner.run.wiring import redis_broker
    from clusterenv.learner.spaces import env_spaces
    from clusterenv.pipeline.cluster.embedded import Stack, WorkersDidNotStart
    from clusterenv.pipeline.connect import RedisUnreachable, connect, redact
    from clusterenv.pipeline.spaces import BoxActions

    try:
        spaces, _ = env_spaces(cfg.env, cfg.env_kwargs, cfg.algo)
        cfg.validate(box_actions=isinstance(spaces.action, BoxActions))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if cfg.redis_url is not None:
        try:  # before the run directory exists: a typo in the URL leaves nothing behind
            connect(cfg.redis_url).close()
        except RedisUnreachable as exc:
            raise CliError(str(exc)) from None
    metrics = _metrics_server(cfg)  # a port in use is refused before the run directory exists
    run_dir, run_id, resumed, lock = _open_run_dir(cfg)
    # Workers and the embedded server are stopped on the way out (after a SIGKILL, their
    # parent-death signal does it).
    stop_on_signals()
    # A learner that seems stuck tells where: `kill -USR1 PID` prints every thread's stack.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        with (
            lock,
            Stack(
                cfg.redis_url,
                cfg.local_workers(),
                run_dir / "workers.log",
                cfg.local_eval_workers(),
            ) as stack,
        ):
            url = stack.redis_url
            assert url is not None
            _wait_for_workers(connect(url), url)
            print(f"run {run_id}: broker {redact(url)}, run dir {run_dir}", file=sys.stderr)
            result = Run.create(
                cfg,
                redis_broker(url, run_id, cfg.weights),
                run_dir,
                run_id,
                resumed,
                metrics.registry if metrics is not None else None,
            ).run()
    except RedisUnreachable as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        print(f"interrupted; partial run in {run_dir}", file=sys.stderr)
        return 130
    except RunFailed as exc:
        print(f"clusterenv: run failed: {exc}; partial run in {run_dir}", file=sys.stderr)
        return 1
    except WorkersDidNotStart as exc:
        print(f"clusterenv: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if metrics is not None:
            metrics.close()
    status = "solved" if result.solved else "budget spent"
    print(
        f"{status}: best eval {result.best_eval:.1f} after {result.env_steps} env steps, "
        f"{result.updates} updates, {result.wall_s:.1f} s; run dir {run_dir}",
        file=sys.stderr,
    )
    return 0


def _metrics_server(cfg: TrainConfig) -> MetricsServer | None:
    """The Prometheus endpoint of --metrics-port, serving from now on; None without the flag."""
    from clusterenv.learner.run.prometheus import serve_metrics

    if cfg.metrics_port is None:
        return None
    try:
        server = serve_metrics(cfg.metrics_host, cfg.metrics_port)
    except OSError as exc:
        raise CliError(
            f"--metrics-port {cfg.metrics_port}: cannot serve on {cfg.metrics_host}: {exc}"
        ) from None
    print(f"metrics: http://{cfg.metrics_host}:{server.port}/metrics", file=sys.stderr)
    return server


def _open_run_dir(cfg: TrainConfig) -> tuple[Path, str, Resumed | None, IO]:
    """A new run directory, or the one --resume names with its newest checkpoint; its lock."""
    from clusterenv.learner.persistence.checkpoint import CheckpointError
    from clusterenv.learner.persistence.resume import load_resume, lock_run_dir, next_run_id

    if cfg.resume is None:
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
        run_id = f"{cfg.env.replace('/', '_')}__s{cfg.seed}__{stamp}"
        run_dir = Path(cfg.run_dir) / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir, run_id, None, lock_run_dir(run_dir)
    run_dir = Path(cfg.resume)
    try:
        lock = lock_run_dir(run_dir)
    except (ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    try:
        resumed = load_resume(run_dir, cfg)
    except CheckpointError as exc:
        lock.close()
        raise CliError(str(exc)) from None
    run_id, st = next_run_id(run_dir), resumed.state
    print(f"resuming from {resumed.checkpoint} ({st['accounting']['env_steps']} env steps, "
          f"{st['learner']['updates']} updates, v{st['publisher']['version']}) as run {run_id}", file=sys.stderr)  # fmt: skip
    return run_dir, run_id, resumed, lock


def _wait_for_workers(client, url: str, timeout_s: float = 600.0) -> None:
    from clusterenv.pipeline.cluster.registry import WorkerRegistry
    from clusterenv.pipeline.connect import redact

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
    from clusterenv.learner.tools.report import write_report

    if not args.run_dirs:
        raise CliError("report needs at least one run directory")
    try:
        print(write_report(args.run_dirs, args.out, args.target))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(f"plots and report.md in {args.out}", file=sys.stderr)
    return 0


def evaluate(args: EvalArgs) -> int:
    from clusterenv.learner.tools.eval_checkpoint import evaluate_checkpoint

    try:
        print(evaluate_checkpoint(args.checkpoint, args.episodes, args.seed, args.video))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return 0


def status(args: StatusArgs) -> int:
    import json

    from clusterenv.learner.run.status import status_line
    from clusterenv.pipeline.cluster.status_board import RedisStatusBoard
    from clusterenv.pipeline.connect import BROKER_ERRORS, RedisUnreachable, connect

    url = args.redis_url or os.environ.get("CLUSTERENV_REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        statuses = RedisStatusBoard(connect(url)).read_all()
    except RedisUnreachable as exc:
        raise CliError(str(exc)) from None
    except BROKER_ERRORS as exc:  # reachable, but refuses (a password, say)
        raise CliError(f"{url}: {exc}") from None
    if args.json:
        print(json.dumps(statuses))
        return 0
    if not statuses:
        print(f"no run status on {url}", file=sys.stderr)
    now = time.time()
    for one in statuses:
        print(status_line(one, now))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    try:
        if command == "train":
            return train(parse_train(rest))
        if command == "eval":
            return evaluate(parse(EvalArgs, rest, "clusterenv eval"))
        if command == "status":
            return status(parse(StatusArgs, rest, "clusterenv status"))
        if command == "report":
            return report(parse(ReportArgs, rest, "clusterenv report"))
        if command in ("-h", "--help"):
            print(USAGE, end="")
            return 0
        if command == "--version":
            print(f"clusterenv {version('clusterenv')}")
            return 0
        raise CliError(
            f"unknown command {command!r}; choose train, eval, report or status"
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
