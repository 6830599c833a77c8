"""The learner's rooms keep their arrows one way: no agent imports another, the run reaches the
agents only through learner/agents.py, and nothing in learner/ talks to Redis but through the
roles of pipeline/roles.py. And what the agents can train on is refused by name otherwise, and
how each acts on what it takes."""

from __future__ import annotations

import ast
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from clusterenv.learner.agents import build_agent
from clusterenv.learner.config import AGENT_CONFIGS, TrainConfig
from clusterenv.learner.spaces import env_spaces
from clusterenv.pipeline.behaviour import Behaviour, Categorical, SquashedGaussian

LEARNER = Path(__file__).resolve().parents[2] / "learner"
AGENTS = ("dqn", "ppo", "sac")


def imports(path: Path) -> list[str]:
    """Every module `path` imports, absolute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def modules() -> list[tuple[Path, list[str]]]:
    return [(p.relative_to(LEARNER), imports(p)) for p in sorted(LEARNER.rglob("*.py"))]


@pytest.mark.parametrize("agent", AGENTS)
def test_an_agent_is_imported_only_by_its_own_folder_the_registry_and_the_run_config(agent):
    prefix = f"clusterenv.learner.{agent}"
    for rel, mods in modules():
        for mod in mods:
            if mod != prefix and not mod.startswith(prefix + "."):
                continue
            own_folder = rel.parts[0] == agent
            # the registry builds agents; the run's config holds the agent's config
            allowed = rel == Path("agents.py") or (
                rel == Path("config.py") and mod == f"{prefix}.config"
            )
            assert own_folder or allowed, f"learner/{rel} imports {mod}"
            assert rel.parts[0] not in set(AGENTS) - {agent}, f"learner/{rel} imports {mod}"


def test_the_learner_imports_no_redis_and_no_celery():
    for rel, mods in modules():
        for mod in mods:
            top = mod.split(".")[0]
            assert top not in ("redis", "celery", "kombu"), f"learner/{rel} imports {mod}"


def test_the_layout_has_the_rooms_the_architecture_names():
    rooms = {p.name for p in LEARNER.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert rooms == {"core", "dqn", "ppo", "sac", "replay", "run", "persistence", "tools"}
    too_long = [(str(p.relative_to(LEARNER)), n) for p in LEARNER.rglob("*.py")
                if (n := len(p.read_text().splitlines())) > 400]  # fmt: skip
    assert not too_long, f"modules over 400 lines: {too_long}"


class ShiftedActions(gym.Env):
    """CartPole's observation, with actions numbered from 1."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2, start=1)


class MultiActions(ShiftedActions):
    action_space = gym.spaces.MultiDiscrete([2, 3])


def test_an_env_the_agents_cannot_train_on_is_refused_by_name():
    with pytest.raises(ValueError, match=r"'Pendulum-v1': --algo dqn needs a Discrete action "
                       r"space, not Box.*\(--algo ppo or sac trains those\)"):  # fmt: skip
        env_spaces("Pendulum-v1", {})
    assert env_spaces("Pendulum-v1", {}, "ppo")[0].action.dim == 1
    gym.register("clusterenv-test/MultiActions-v0", MultiActions)
    with pytest.raises(ValueError, match="--algo ppo needs a Discrete or Box action space"):
        env_spaces("clusterenv-test/MultiActions-v0", {}, "ppo")
    with pytest.raises(ValueError, match=r"--algo sac needs a Box .*\(--algo dqn or ppo trains"):
        env_spaces("CartPole-v1", {}, "sac")
    with pytest.raises(ValueError, match="--env-kwargs for 'CartPole-v1'"):
        env_spaces("CartPole-v1", {"no_such_kwarg": 1})
    gym.register("clusterenv-test/Shifted-v0", ShiftedActions)
    with pytest.raises(ValueError, match="Discrete actions numbered from 0"):
        env_spaces("clusterenv-test/Shifted-v0", {})


@pytest.mark.parametrize("algo", AGENTS)
def test_each_agent_kind_acts_on_every_action_space_it_takes_with_its_default_sync(algo):
    # What learner/config.py's AgentKind asks of an agent's config, read for each space it
    # declares: its workers' policy kind exists there, and the default rule measures that kind.
    cfg = TrainConfig.for_algo(algo)
    kind = AGENT_CONFIGS[algo]
    assert kind.ACTION_SPACES, algo
    for space in kind.ACTION_SPACES:
        box = space is gym.spaces.Box
        assert issubclass(kind.policy_kind(box), Behaviour)
        assert cfg.sync_measure(box) in kind.policy_kind(box).DIVERGENCES
    if not kind.Q_VALUES:
        cfg.weights.sync = "aps:0.01:value"
        with pytest.raises(ValueError, match="the value measure needs Q-values"):
            cfg.check_sync(box_actions=True)


def test_a_sync_measure_is_checked_against_the_envs_actions_once_they_are_known():
    # PPO takes Discrete and Box actions: before the env is known, a measure that fits either
    # passes; with the env's actions, the refusal names that env's choices only.
    cfg = TrainConfig.for_algo("ppo")
    cfg.weights.sync = "aps:0.1:tv"
    cfg.validate()
    cfg.validate(box_actions=False)
    with pytest.raises(
        ValueError, match=r"'tv' does not apply to squashed_gaussian .*; choose kl$"
    ):
        cfg.validate(box_actions=True)
    cfg.weights.sync = "aps:0.01:value"
    with pytest.raises(ValueError, match=r"needs Q-values \(DQN, SAC\); choose kl$"):
        cfg.validate(box_actions=True)
    with pytest.raises(ValueError, match=r"needs Q-values \(DQN, SAC\); choose kl, tv$"):
        cfg.validate(box_actions=False)
    with pytest.raises(ValueError, match="needs Q-values"):
        cfg.validate()


def test_ppo_acts_by_its_policy_kind_on_each_action_space():
    cfg = TrainConfig.for_algo("ppo")
    for env, kind in (("CartPole-v1", Categorical), ("Pendulum-v1", SquashedGaussian)):
        spaces, _ = env_spaces(env, {}, "ppo")
        agent = build_agent(cfg, spaces, lambda version: 0)
        assert type(agent.behaviour(0, 1)) is kind, env
