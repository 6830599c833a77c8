"""The run's configuration: one typed dataclass per component, every field a documented setting,
and the agent's own config (learner/dqn/config.py, learner/ppo/config.py) as `agent`.

`clusterenv train` derives its flags from `TrainConfig[the agent's config]` with tyro
(learner/tools/cli.py); nested components' flags carry no prefix (`--lr`, not `--agent.lr`), so
every setting's name is unique across the run's components and one agent's. A run directory
stores the whole tree as config.json.
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Annotated, Any, ClassVar, Generic, Literal, Protocol, TypeVar

import gymnasium as gym
import torch
from tyro.conf import arg
from tyro.constructors import PrimitiveConstructorSpec

from clusterenv.learner.core.settings import require_non_negative, require_positive
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.ppo.config import PPOConfig
from clusterenv.learner.sac.config import SACConfig
from clusterenv.pipeline.behaviour import Behaviour
from clusterenv.pipeline.chunks.dispatcher import DispatchConfig
from clusterenv.pipeline.connect import redact
from clusterenv.pipeline.sync.rules import DEFAULT_SYNC, parse_sync


class AgentKind(Protocol):
    """What the run must know of an agent before it is built, read off its config's class: the
    env spaces it takes (learner/spaces.py), the sync measures its workers' policies allow, whether
    a checkpoint can carry replay."""

    ACTION_SPACES: ClassVar[tuple[type[gym.Space], ...]]
    """the action spaces it trains on"""
    Q_VALUES: ClassVar[bool]
    """whether the learner has Q-values of actions (APS's `value` measure reads them)"""
    REPLAY: ClassVar[bool]
    """whether it learns from replay (which --checkpoint-replay saves)"""

    @staticmethod
    def policy_kind(box_actions: bool) -> type[Behaviour]:
        """How its workers act on these actions (pipeline/behaviour.py), whose divergences APS
        may measure."""
        ...


# Each agent's config by the name `--algo` gives.
AGENT_CONFIGS: dict[str, type[AgentKind]] = {"dqn": DQNConfig, "ppo": PPOConfig, "sac": SACConfig}
AgentConfig = TypeVar("AgentConfig", DQNConfig, PPOConfig, SACConfig)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a task argument can carry")


def _json_object(args: list[str]) -> dict[str, Any]:
    # A JSONDecodeError is a ValueError: tyro reports it on the flag. NaN and Infinity (which
    # Python's json reads) are refused here, as the workers' task arguments refuse them.
    value = json.loads(args[0], parse_constant=_no_constant)
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    return value


JsonObject = Annotated[
    dict[str, Any],
    PrimitiveConstructorSpec(
        nargs=1,
        metavar="JSON",
        instance_from_str=_json_object,
        is_instance=lambda value: isinstance(value, dict),
        str_from_instance=lambda value: [json.dumps(value)],
    ),
]


@dataclass
class CollectionConfig:
    envs_per_worker: int = 8
    """vectorized envs each worker process steps"""
    chunk_steps: int = 32
    """steps per env in one chunk (a chunk holds envs_per_worker x chunk_steps env steps)"""
    error_buffer_chunks: float = 4.0
    """chunks that collection may run ahead of (or behind) the learner's rate limit"""
    chunk_time_limit_s: Annotated[
        float | None, arg(help_behavior_hint="(default: 2/3 of --lost-after-s)")
    ] = None
    """seconds a worker may spend on one chunk; past it the env counts as hung and the chunk is
    cut off (the steps before are kept), like an env that raised; 0: no limit. Below
    --lost-after-s, so the learner hears of a hang before it writes the chunk off"""
    env_faults_in_a_row: int = 20
    """chunks in a row whose env raised or hung that end the run (an env failing every time)"""

    @property
    def chunk_env_steps(self) -> int:
        return self.envs_per_worker * self.chunk_steps


@dataclass
class WeightSyncConfig:
    sync: str = DEFAULT_SYNC
    """weight sync rule: always | on-change | interval:N (env steps) | aps:TOL[:value|tv|kl]"""
    max_lag_versions: int = 0
    """aps guard: fetch when this many versions behind (0: off)"""
    max_lag_seconds: float = 0.0
    """aps guard: fetch when the held policy is this many seconds old (0: off)"""
    reference_size: int = 256
    """reference states the probes are computed on"""
    reference_every: int = 16
    """published versions between refreshes of the reference states"""
    weight_ttl_s: int = 600
    """seconds a published version (weights, probe, reference) stays on the broker"""
    weights_kept: int = 64
    """published versions kept; older ones are deleted (a worker holding one then fetches)"""
    weights_dtype: Literal["float32", "float16"] = "float32"
    """float type of published weights: float16 halves what each fetch moves (the workers act
    with exactly those weights; the learner keeps training in float32)"""


@dataclass
class EvalConfig:
    eval_every: int = 2_000
    """env steps between greedy evaluations"""
    eval_episodes: int = 10
    """episodes per greedy evaluation (their mean is compared to the target)"""
    solve_evals: int = 1
    """consecutive evaluations at or above the target that stop the run (2: robust to one lucky eval)"""
    eval_tasks: int = 0
    """worker tasks one evaluation is split into; 0: half the live worker processes (at least 1)"""
    eval_timeout_s: float = 120.0
    """seconds an evaluation may take before it is given up (and, at the end of a run, skipped)"""

    def parts(self, alive_processes: int) -> int:
        """Tasks for one evaluation: never more than its episodes."""
        wanted = self.eval_tasks or max(1, alive_processes // 2)
        return max(1, min(wanted, self.eval_episodes))


@dataclass
class CheckpointConfig:
    checkpoint_every_s: float = 60.0
    """seconds between periodic checkpoints (what --resume continues from); 0: no time trigger"""
    checkpoint_every_updates: int = 0
    """gradient steps between periodic checkpoints, whichever trigger comes first; 0: off"""
    checkpoints_kept: int = 3
    """newest periodic checkpoints kept in RUN_DIR/checkpoints; older ones are deleted"""
    checkpoint_replay: bool = False
    """store replay in checkpoints too (bigger files); without it a resumed run refills replay
    up to --learning-starts before it learns again"""


@dataclass
class TrainConfig(Generic[AgentConfig]):
    """Train an agent (Double DQN by default; PPO with --algo ppo, whose own flags
    `clusterenv train --algo ppo --help` lists): envs on Celery workers, transitions through
    Redis, one learner.

    Without --redis-url, starts an embedded Redis-compatible server, one local celery worker per
    core and one that only evaluates. With --redis-url, uses the workers attached to that broker
    plus --workers local ones.
    """

    env: str = "CartPole-v1"
    """Gymnasium env id with Box observations, and Discrete actions (dqn, ppo) or bounded Box
    ones (ppo, sac)"""
    algo: Literal["dqn", "ppo", "sac"] = "dqn"
    """dqn: Double DQN from replay, workers act ε-greedily; ppo: PPO on chunks, workers sample
    their cached policy and send its log-probs (docs/architecture.md, PPO); sac: soft
    actor-critic from replay on Box actions, workers sample the actor. Each has its own settings
    (`clusterenv train --algo ALGO --help`)"""
    preset: bool = True
    """start from the entry for --algo on --env in learner/tools/presets.toml when there is one
    (flags override it); --no-preset: the plain defaults below"""
    env_kwargs: JsonObject = field(default_factory=dict)
    """keyword arguments for gymnasium.make as a JSON object, e.g. '{"g": 9.8}'"""
    seed: int = 1
    """seed for the learner, the workers' envs and exploration"""
    total_steps: int = 100_000
    """env-step budget; the run stops when it is spent"""
    # An unset setting's help names what it means, once (tyro would add "(default: None)").
    target_return: Annotated[
        float | None, arg(help_behavior_hint="(default: the env's reward_threshold)")
    ] = None
    """stop once the greedy eval mean reaches this"""
    redis_url: Annotated[
        str | None, arg(help_behavior_hint="(default: start an embedded server)")
    ] = None
    """Redis broker shared with the workers (a password, ACL user and TLS options go in the URL:
    docs/operations.md)"""
    workers: Annotated[
        int | None, arg(help_behavior_hint="(default: one per core without --redis-url, 0 with it)")
    ] = None
    """local worker processes to start"""
    eval_workers: Annotated[
        int | None, arg(help_behavior_hint="(default: 1 if local workers are started, else 0)")
    ] = None
    """local worker processes that only evaluate (Celery queue clusterenv:eval), so an evaluation
    never takes a collecting worker away; collecting workers evaluate too"""
    run_dir: str = "runs"
    """parent folder of the run directory"""
    resume: Annotated[str | None, arg(help_behavior_hint="(default: a new run)")] = None
    """continue the run in this run directory from its newest checkpoint, with its config.json (a
    flag that would change the experiment is refused; docs/reliability.md lists those that may)"""
    status_every_s: float = 30.0
    """without a terminal, seconds between status lines on stderr (steps/s, eval, version, fetches)"""
    metrics_port: Annotated[int | None, arg(help_behavior_hint="(default: off)")] = None
    """serve Prometheus metrics at http://METRICS_HOST:PORT/metrics (steps/s, updates/s, chunks in
    flight per live worker, policy lag, env errors...; docs/operations.md); 0 picks a free port"""
    metrics_host: str = "127.0.0.1"
    """address the metrics server binds: 0.0.0.0 for a Prometheus on another machine or pod (the
    figures are not secret, but they say what runs where)"""
    # One thread: with two, torch's intra-op threads spin against the workers and any other
    # process on a small machine; a contended learner was measured ~20x slower per update.
    torch_threads: int = 1
    """torch intra-op threads for the learner"""
    device: str = "auto"
    """torch device of the learner's networks and updates: auto (cuda where torch sees one,
    else cpu) | cpu | cuda | cuda:N. Workers always act with numpy on their CPUs"""
    updates_per_turn: int = 16
    """learner updates between the loop's looks at arrivals, dispatch and evaluation"""
    collection: CollectionConfig = field(default_factory=CollectionConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    weights: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    agent: AgentConfig = field(default_factory=DQNConfig)

    def validate(self, box_actions: bool | None = None) -> None:
        """Raise ValueError naming the first bad setting; `box_actions` as for check_sync."""
        if not isinstance(self.agent, AGENT_CONFIGS[self.algo]):
            raise ValueError(
                f"--algo {self.algo} needs its own settings, not {type(self.agent).__name__}"
            )
        for part, names in (
            (self, ("total_steps", "updates_per_turn", "status_every_s")),
            (self.collection, ("envs_per_worker", "chunk_steps")),
            (self.weights, ("reference_size", "reference_every", "weight_ttl_s", "weights_kept")),
            (self.dispatch, ("tasks_per_process", "chunks_per_task", "lost_after_s")),
            (self.evaluation, ("eval_every", "eval_episodes", "eval_timeout_s", "solve_evals")),
            (self.checkpoint, ("checkpoints_kept",)),
        ):
            require_positive(part, names)
        require_non_negative(self, [n for n in ("workers", "eval_workers")
                                    if getattr(self, n) is not None])  # fmt: skip
        require_non_negative(self.evaluation, ("eval_tasks",))
        require_non_negative(self.collection, ("error_buffer_chunks",))
        require_positive(self.collection, ("env_faults_in_a_row",))
        limit = self.chunk_time_limit_s()
        if not 0 <= limit < self.dispatch.lost_after_s:
            raise ValueError(f"--chunk-time-limit-s ({limit:g}) must be below --lost-after-s "
                             f"({self.dispatch.lost_after_s:g}), or 0 for no limit")  # fmt: skip
        ck = self.checkpoint
        if ck.checkpoint_every_s < 0 or ck.checkpoint_every_updates < 0:
            raise ValueError("--checkpoint-every-s and --checkpoint-every-updates must be >= 0")
        if self.torch_threads < 1:
            raise ValueError(f"--torch-threads must be >= 1, got {self.torch_threads}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(
                f"--metrics-port must be a TCP port (0-65535), got {self.metrics_port}"
            )
        w = self.weights
        if w.max_lag_versions < 0 or not w.max_lag_seconds >= 0:
            raise ValueError("--max-lag-versions and --max-lag-seconds must be >= 0")
        self.torch_device()  # raises on a device torch cannot use
        self.agent.validate()
        if not self.agent.REPLAY and self.checkpoint.checkpoint_replay:
            raise ValueError(f"--checkpoint-replay: --algo {self.algo} learns from fresh chunks "
                             "and has no replay to keep")  # fmt: skip
        self.check_sync(box_actions)

    def check_sync(self, box_actions: bool | None = None) -> None:
        """ValueError naming what is wrong with --sync for how the workers will act: on Box
        actions or not, which allow different divergences. Before the env's spaces are known
        (None) it passes if it fits any action space the agent takes, for the env's own check
        to decide: refusing it for one of them would name choices that may not be the env's."""
        if box_actions is not None:
            self.sync_measure(box_actions)
            return
        refusals = []
        for box in sorted({issubclass(s, gym.spaces.Box) for s in self.agent.ACTION_SPACES}):
            try:
                self.sync_measure(box)
                return
            except ValueError as exc:
                refusals.append(exc)
        raise refusals[-1]

    def sync_measure(self, box_actions: bool = False) -> str | None:
        """The divergence --sync's aps rule measures (None for other rules); a ValueError naming
        what is wrong with --sync."""
        w = self.weights
        rule = parse_sync(w.sync, w.max_lag_versions, w.max_lag_seconds,
                          self.agent.policy_kind(box_actions), q_values=self.agent.Q_VALUES)  # fmt: skip
        return getattr(rule, "divergence", None)

    def chunk_time_limit_s(self) -> float:
        """--chunk-time-limit-s, or its default: two thirds of --lost-after-s."""
        limit = self.collection.chunk_time_limit_s
        return self.dispatch.lost_after_s * 2 / 3 if limit is None else limit

    def torch_device(self) -> torch.device:
        """The learner's device; ValueError naming --device if torch cannot use it here."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise ValueError(
                f"--device {self.device!r}: not a torch device (cpu, cuda, cuda:N)"
            ) from None
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"--device {self.device!r}: the learner runs on cpu or cuda")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"--device {self.device}: torch {torch.__version__} sees no CUDA device here"
            )
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(
                f"--device {self.device}: only {torch.cuda.device_count()} CUDA devices"
            )
        return device

    def settings(self) -> dict[str, tuple[Any, str]]:
        """Every setting by its flat name (its flag without dashes; names are unique across the
        run's components and its agent's, since the CLI's flags carry no prefix) -> (the object
        holding it, its field)."""
        out: dict[str, tuple[Any, str]] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if is_dataclass(value):
                out.update({g.name: (value, g.name) for g in fields(value)})
            else:
                out[f.name] = (self, f.name)
        return out

    def local_workers(self) -> int:
        if self.workers is not None:
            return self.workers
        return 0 if self.redis_url else (os.cpu_count() or 1)

    def local_eval_workers(self) -> int:
        if self.eval_workers is not None:
            return self.eval_workers
        return 1 if self.local_workers() > 0 else 0

    def to_json(self) -> str:
        """The config as written to config.json; a password in the Redis URL is not."""
        tree = asdict(self)
        if self.redis_url is not None:
            tree["redis_url"] = redact(self.redis_url)
        return json.dumps(tree, indent=2)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        """The config a run directory stored (config.json); ValueError naming an unknown setting."""
        values = json.loads(text)
        if "agent" not in values and ("dqn" in values or "ppo" in values):
            raise ValueError("written by an older clusterenv (settings under 'dqn' and 'ppo', not "
                             "'agent'); this version cannot resume that run")  # fmt: skip
        algo = values.get("algo", "dqn")
        if algo not in AGENT_CONFIGS:
            raise ValueError(f"unknown algo {algo!r}")
        agent = values.get("agent", {})
        if not isinstance(agent, dict):
            raise ValueError("setting 'agent' must be an object")
        tree = {**values, "agent": _from_dict(AGENT_CONFIGS[algo], agent, "agent.")}
        return _from_dict(cls, tree, "")

    @classmethod
    def for_algo(cls, algo: str, **values: Any) -> TrainConfig:
        """The defaults with `algo`'s own agent config (ValueError for an unknown algo)."""
        if algo not in AGENT_CONFIGS:
            raise ValueError(f"--algo {algo!r} is not one of {', '.join(AGENT_CONFIGS)}")
        return cls(algo=algo, agent=AGENT_CONFIGS[algo](), **values)  # type: ignore[arg-type]


def _from_dict(kind: type, values: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(kind)
    unknown = sorted(set(values) - {f.name for f in fields(kind)})
    if unknown:  # a config.json written by another version of clusterenv
        raise ValueError(f"unknown setting {where}{unknown[0]!r}")
    return kind(**{
        name: _from_dict(hints[name], value, f"{where}{name}.")
        if isinstance(hints[name], type) and is_dataclass(hints[name]) and isinstance(value, dict)
        else value
        for name, value in values.items()
    })  # fmt: skip
