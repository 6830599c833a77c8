"""The run configuration: one typed dataclass per component, every field a documented setting.

`clusterenv train` derives its flags from `TrainConfig` with tyro (learner/cli.py); the nested
components' flags carry no prefix (`--lr`, not `--dqn.lr`). A run directory stores the whole
tree as config.json.
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Annotated, Any, Literal

from tyro.conf import arg
from tyro.constructors import PrimitiveConstructorSpec

from clusterenv.pipeline.behaviour import Behaviour, Categorical, EpsilonGreedy
from clusterenv.pipeline.chunks.dispatcher import DispatchConfig
from clusterenv.pipeline.connect import redact
from clusterenv.pipeline.sync.rules import DEFAULT_SYNC, parse_sync


def _json_object(args: list[str]) -> dict[str, Any]:
    value = json.loads(args[0])  # a JSONDecodeError is a ValueError: tyro reports it on the flag
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
    eps_start: float = 1.0
    """initial exploration epsilon (DQN; PPO samples its policy)"""
    eps_end: float = 0.04
    """final exploration epsilon (DQN)"""
    eps_decay_steps: int = 8_000
    """env steps over which epsilon decays linearly (DQN; RL-Zoo's CartPole: 0.16 of its 50k)"""

    @property
    def chunk_env_steps(self) -> int:
        return self.envs_per_worker * self.chunk_steps

    def epsilon(self, env_steps: int) -> float:
        return linear(self.eps_start, self.eps_end, env_steps, self.eps_decay_steps)


@dataclass
class WeightSyncConfig:
    sync: str = DEFAULT_SYNC
    """weight sync rule: always | on-change | interval:N (env steps) | aps:TOL[:value|tv|kl]"""
    max_lag_versions: int = 0
    """aps guard: fetch when this many versions behind (0: off)"""
    max_lag_seconds: float = 0.0
    """aps guard: fetch when the held policy is this many seconds old (0: off)"""
    publish_every: int = 128
    """gradient steps between published weight versions (DQN; PPO publishes after every update)"""
    reference_size: int = 256
    """reference states the probes are computed on"""
    reference_every: int = 16
    """published versions between refreshes of the reference states"""
    weight_ttl_s: int = 600
    """seconds a published version (weights, probe, reference) stays on the broker"""
    weights_kept: int = 64
    """published versions kept; older ones are deleted (a worker holding one then fetches)"""


def linear(start: float, end: float, steps: int, over: int) -> float:
    """From `start` at 0 steps to `end` at `over` steps, and `end` after (ε's and lr's schedules)."""
    return start + min(1.0, steps / max(1, over)) * (end - start)


def hidden_sizes(text: str, flag: str) -> list[int]:
    """Layer sizes from "256,256"; a ValueError naming the flag otherwise."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"--{flag} must be positive integers like 256,256, got {text!r}")
    return sizes


@dataclass
class DQNConfig:
    lr: float = 2.3e-3
    """Adam learning rate"""
    lr_end: Annotated[float | None, arg(help_behavior_hint="(default: --lr throughout)")] = None
    """learning rate reached at --total-steps env steps, linearly from --lr (RL-Zoo's lin_
    schedules)"""
    batch_size: int = 64
    """minibatch size"""
    gamma: float = 0.99
    """discount"""
    hidden: str = "256,256"
    """hidden layer sizes of the Q-network, comma-separated"""
    target_update_every: int = 128
    """gradient steps between target-network copies"""
    max_grad_norm: float = 10.0
    """gradient clipping norm"""
    double: bool = True
    """Double DQN targets (the online net picks the next action); --no-double: plain DQN's max"""

    def hidden_sizes(self) -> list[int]:
        return hidden_sizes(self.hidden, "hidden")

    def lr_at(self, env_steps: int, total_steps: int) -> float:
        """The learning rate once `env_steps` of the run's `total_steps` are collected."""
        if self.lr_end is None:
            return self.lr
        return linear(self.lr, self.lr_end, env_steps, total_steps)


@dataclass
class PPOConfig:
    """PPO on chunks (learner/ppo.py); CleanRL's ppo.py defaults. Flags differ from DQN's (the
    CLI's flags carry no prefix): --ppo-lr, --ppo-gamma, --ppo-hidden, --ppo-max-grad-norm."""

    ppo_lr: float = 2.5e-4
    """Adam learning rate (constant: an asynchronous run has no fixed number of updates to anneal over)"""
    ppo_gamma: float = 0.99
    """discount"""
    gae_lambda: float = 0.95
    """lambda of generalized advantage estimation"""
    clip_coef: float = 0.2
    """PPO's clip range of the ratio pi/pi_center (--ppo-clip-center)"""
    ppo_clip_center: Literal["learner", "behaviour"] = "learner"
    """learner: clip pi/pi_learner, the learner's policy at the start of the update, and weight each
    row by pi_learner/pi_behaviour truncated at 1 (decoupled PPO, Hilton et al. 2022: the trust
    region stays around the learner however stale the chunk); behaviour: clip pi/pi_behaviour
    (APPO). The same loss when the chunks are not stale"""
    ppo_advantages: Literal["gae", "vtrace"] = "gae"
    """gae: GAE(lambda) on the current critic, uncorrected for lag; vtrace: each later step's part
    of the lambda-trace cut by min(1, pi_learner/pi_behaviour) of its action, and value targets
    weighted by it (V-trace, IMPALA, with both truncations at 1). The same when chunks are not stale"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    clip_vloss: bool = True
    """clip the value loss around the values at the start of the update, as CleanRL"""
    norm_adv: bool = True
    """normalize advantages per minibatch"""
    ppo_max_grad_norm: float = 0.5
    """gradient clipping norm"""
    update_epochs: int = 4
    """passes over each batch"""
    num_minibatches: int = 4
    """minibatches per pass"""
    batch_steps: int = 512
    """transitions (whole chunks) per PPO update; CleanRL: 4 envs x 128 steps"""
    max_policy_lag: int = 8
    """chunks acted by a policy version more than this many versions behind the newest (one version
    per PPO update) are dropped before training, and counted"""
    ppo_hidden: str = "64,64"
    """hidden layer sizes of the policy and of the value network, comma-separated"""


@dataclass
class ReplayConfig:
    buffer_size: int = 100_000
    """replay capacity in transitions"""
    learning_starts: int = 1_000
    """transitions in replay before the first update"""
    samples_per_insert: float = 32.0
    """sampled transitions per inserted one (128 updates x 64 per 256 env steps = 32)"""
    error_buffer_chunks: float = 4.0
    """chunks that collection may run ahead of (or behind) the samples-per-insert ratio"""
    updates_per_turn: int = 16
    """gradient steps between the learner's looks at arrivals, dispatch and evaluation"""


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
class TrainConfig:
    """Train Double DQN (or PPO: --algo ppo): envs on Celery workers, transitions through Redis,
    one learner.

    Without --redis-url, starts an embedded Redis-compatible server, one local celery worker per
    core and one that only evaluates. With --redis-url, uses the workers attached to that broker
    plus --workers local ones.
    """

    env: str = "CartPole-v1"
    """Gymnasium env id (Discrete actions, Box observations)"""
    algo: Literal["dqn", "ppo"] = "dqn"
    """dqn: Double DQN from replay, workers act ε-greedily; ppo: PPO on chunks, workers sample
    their cached policy and send its log-probs (docs/architecture.md, PPO)"""
    preset: bool = True
    """start from the entry for --algo on --env in learner/presets.toml when there is one (flags
    override it); --no-preset: the plain defaults below"""
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
    # One thread: with two, torch's intra-op threads spin against the workers and any other
    # process on a small machine; a contended learner was measured ~20x slower per update.
    torch_threads: int = 1
    """torch intra-op threads for the learner"""
    collection: CollectionConfig = field(default_factory=CollectionConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    weights: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        positive = [
            (self, "total_steps"), (self.collection, "envs_per_worker"),
            (self.collection, "chunk_steps"), (self.dqn, "batch_size"),
            (self.replay, "buffer_size"), (self.dqn, "target_update_every"),
            (self.weights, "publish_every"), (self.evaluation, "eval_every"),
            (self.evaluation, "eval_episodes"), (self.weights, "reference_size"),
            (self.weights, "reference_every"), (self.weights, "weight_ttl_s"),
            (self.weights, "weights_kept"), (self.replay, "updates_per_turn"),
            (self.dispatch, "tasks_per_process"), (self.dispatch, "chunks_per_task"),
            (self.dispatch, "lost_after_s"),
            (self.evaluation, "eval_timeout_s"), (self.evaluation, "solve_evals"),
            (self, "status_every_s"), (self.checkpoint, "checkpoints_kept"),
        ]  # fmt: skip
        for part, name in positive:
            if getattr(part, name) <= 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be positive, got {getattr(part, name)}"
                )
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"--workers must be >= 0, got {self.workers}")
        if self.eval_workers is not None and self.eval_workers < 0:
            raise ValueError(f"--eval-workers must be >= 0, got {self.eval_workers}")
        if self.replay.learning_starts < self.dqn.batch_size:
            raise ValueError("--learning-starts must be at least --batch-size")
        if not 0.0 < self.dqn.gamma <= 1.0:
            raise ValueError(f"--gamma must be in (0, 1], got {self.dqn.gamma}")
        if self.dqn.lr <= 0 or self.replay.samples_per_insert <= 0:
            raise ValueError("--lr and --samples-per-insert must be positive")
        if self.dqn.lr_end is not None and not self.dqn.lr_end >= 0.0:  # NaN too
            raise ValueError(f"--lr-end must be >= 0, got {self.dqn.lr_end}")
        if self.evaluation.eval_tasks < 0:
            raise ValueError(f"--eval-tasks must be >= 0, got {self.evaluation.eval_tasks}")
        if self.replay.error_buffer_chunks < 0:
            raise ValueError("--error-buffer-chunks must be >= 0")
        c = self.collection
        if not (0.0 <= c.eps_end <= c.eps_start <= 1.0):
            raise ValueError("need 0 <= --eps-end <= --eps-start <= 1")
        ck = self.checkpoint
        if ck.checkpoint_every_s < 0 or ck.checkpoint_every_updates < 0:
            raise ValueError("--checkpoint-every-s and --checkpoint-every-updates must be >= 0")
        if self.torch_threads < 1:
            raise ValueError(f"--torch-threads must be >= 1, got {self.torch_threads}")
        w = self.weights
        if w.max_lag_versions < 0 or not w.max_lag_seconds >= 0:
            raise ValueError("--max-lag-versions and --max-lag-seconds must be >= 0")
        self.dqn.hidden_sizes()  # raises on a bad list
        self._validate_ppo()
        if self.algo == "ppo" and self.checkpoint.checkpoint_replay:
            raise ValueError(
                "--checkpoint-replay: PPO learns from fresh chunks and has no replay to keep"
            )
        parse_sync(w.sync, w.max_lag_versions, w.max_lag_seconds, self.policy_kind)

    def _validate_ppo(self) -> None:
        p = self.ppo
        for name in (
            "ppo_lr",
            "update_epochs",
            "num_minibatches",
            "batch_steps",
            "ppo_max_grad_norm",
        ):
            if not getattr(p, name) > 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be positive, got {getattr(p, name)}"
                )
        for name in ("clip_coef", "ent_coef", "vf_coef", "max_policy_lag"):
            if not getattr(p, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(p, name)}")
        if not 0.0 < p.ppo_gamma <= 1.0 or not 0.0 <= p.gae_lambda <= 1.0:
            raise ValueError("need 0 < --ppo-gamma <= 1 and 0 <= --gae-lambda <= 1")
        if p.batch_steps < p.num_minibatches:
            raise ValueError("--batch-steps must be at least --num-minibatches")
        hidden_sizes(p.ppo_hidden, "ppo-hidden")

    @property
    def policy_kind(self) -> type[Behaviour]:
        """How workers act (pipeline/behaviour.py): ε-greedy on Q for DQN, sampled logits for PPO."""
        return Categorical if self.algo == "ppo" else EpsilonGreedy

    def settings(self) -> dict[str, tuple[Any, str]]:
        """Every setting by its flat name (its flag without dashes; names are unique across
        components, since the CLI's flags carry no prefix) -> (the object holding it, its field)."""
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
        return _from_dict(cls, json.loads(text), "")


def _from_dict(kind: type, values: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(kind)
    unknown = sorted(set(values) - {f.name for f in fields(kind)})
    if unknown:  # a config.json written by another version of clusterenv
        raise ValueError(f"unknown setting {where}{unknown[0]!r}")
    return kind(**{
        name: _from_dict(hints[name], value, f"{where}{name}.") if is_dataclass(hints[name]) else value
        for name, value in values.items()
    })  # fmt: skip
