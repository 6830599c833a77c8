"""Per-env presets: the shipped file is valid, flags override it, --no-preset ignores it."""

from __future__ import annotations

import json

import pytest

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.tools.cli import CliError, parse_train
from clusterenv.learner.tools.presets import EVERY_ENV, defaults_for, load_presets, preset_choice

SHIPPED = [(algo, env) for algo, envs in load_presets().items() for env in envs if env != EVERY_ENV]


@pytest.mark.parametrize("algo, env", SHIPPED)
def test_every_shipped_preset_applies_and_validates(algo, env):
    cfg = defaults_for(env, algo, use_preset=True)
    cfg.validate()
    assert load_presets()[algo][env] and cfg.env == env and cfg.algo == algo and cfg.preset


def test_the_envs_the_issue_names_have_dqn_presets():
    names = {"CartPole-v1", "Acrobot-v1", "LunarLander-v3", "MountainCar-v0"}
    assert names <= set(load_presets()["dqn"])


def test_a_dqn_preset_does_not_reach_a_ppo_run():
    dqn = parse_train(["--env", "Acrobot-v1"])
    ppo = parse_train(["--env", "Acrobot-v1", "--algo", "ppo"])
    assert dqn.total_steps == 100_000 and dqn.agent.batch_size == 128
    assert ppo.total_steps == 200_000  # PPO's own entry
    # DQN's Acrobot entry sets lr 6.3e-4; PPO's sets none: PPO keeps its own default.
    assert ppo.agent.lr == TrainConfig.for_algo("ppo").agent.lr == 2.5e-4


def test_cartpole_dqn_syncs_on_change_unless_a_flag_says_otherwise():
    """Fresh weights on every chunk brought CartPole's env steps to SB3's (docs/benchmarks.md)."""
    assert TrainConfig().weights.sync == "aps:0.01"
    assert parse_train([]).weights.sync == "on-change"  # CartPole-v1 is the default env
    assert parse_train(["--env", "CartPole-v1", "--sync", "aps:0.05"]).weights.sync == "aps:0.05"
    assert parse_train(["--env", "CartPole-v1", "--no-preset"]).weights.sync == "aps:0.01"


def test_cartpole_dqn_collects_chunks_of_128_steps_per_env_unless_a_flag_says_otherwise():
    """Celery's fixed cost per task, spread over 4x the env steps (docs/benchmarks.md)."""
    assert TrainConfig().collection.chunk_steps == 32
    assert parse_train([]).collection.chunk_steps == 128  # CartPole-v1 is the default env
    assert parse_train(["--chunk-steps", "32"]).collection.chunk_steps == 32
    assert parse_train(["--env", "Acrobot-v1"]).collection.chunk_steps == 32
    assert parse_train(["--algo", "ppo"]).collection.chunk_steps == 32


PLAIN = (1, False, "schedule", False)  # n-step, prioritized, exploration, dueling: DQN without them


@pytest.mark.parametrize("env, four", [("Acrobot-v1", (3, True, "ladder", True)),
                                        ("MountainCar-v0", (3, False, "schedule", False)),
                                        ("LunarLander-v3", PLAIN), ("CartPole-v1", PLAIN)])  # fmt: skip
def test_the_ablation_set_the_ape_x_features_where_they_helped(env, four):
    """All four together reached the bar sooner on Acrobot-v1, later on LunarLander-v3; on
    MountainCar-v0 3-step returns alone held it at the end of the budget in every run (docs/
    benchmarks.md, "DQN ablation"); flags take any of them back off."""

    def features(args: list[str]) -> tuple:
        agent = parse_train(["--env", env, *args]).agent
        return agent.n_step, agent.prioritized, agent.exploration, agent.dueling

    assert features([]) == four
    off = ["--n-step", "1", "--no-prioritized", "--exploration", "schedule", "--no-dueling"]
    assert features(off) == PLAIN


def test_flags_override_the_preset_and_config_json_records_what_was_used():
    cfg = parse_train(["--env", "Acrobot-v1", "--lr", "1e-3"])
    assert cfg.agent.lr == 1e-3  # the flag
    assert cfg.agent.batch_size == 128 and cfg.agent.samples_per_insert == 128.0  # the preset
    recorded = json.loads(cfg.to_json())
    assert recorded["preset"] is True and recorded["agent"]["batch_size"] == 128


def test_no_preset_gives_the_plain_defaults():
    plain = TrainConfig(env="Acrobot-v1")
    cfg = parse_train(["--env=Acrobot-v1", "--no-preset"])
    assert cfg.agent == plain.agent and not cfg.preset


def test_an_env_without_an_entry_keeps_the_defaults():
    assert parse_train(["--env", "Pendulum-v1"]).agent == TrainConfig().agent


def test_every_ppo_run_gets_the_measured_sync_settings_below_its_env_entry_and_the_flags():
    plain = TrainConfig.for_algo("ppo")
    assert (plain.weights.sync, plain.agent.max_policy_lag) != ("aps:0.02", 32)
    for env in ("CartPole-v1", "Acrobot-v1", "Pendulum-v1"):  # the last has no entry of its own
        cfg = parse_train(["--algo", "ppo", "--env", env])
        assert (cfg.weights.sync, cfg.agent.max_policy_lag, cfg.weights.reference_size) == (
            "aps:0.02",
            32,
            32,
        ), env
    assert parse_train(["--algo", "ppo", "--env", "Acrobot-v1"]).total_steps == 200_000
    flags = parse_train(["--algo", "ppo", "--sync", "on-change", "--max-policy-lag", "4"])
    assert (flags.weights.sync, flags.agent.max_policy_lag, flags.weights.reference_size) == (
        "on-change",
        4,
        32,
    )
    off = parse_train(["--algo", "ppo", "--no-preset"])
    assert off.weights == plain.weights and off.agent == plain.agent
    # DQN has no "*" entry: an env entry without sync settings keeps the defaults
    assert parse_train(["--env", "Acrobot-v1"]).weights == TrainConfig().weights


def test_an_env_entry_overrides_the_every_env_entry(tmp_path):
    path = tmp_path / "presets.toml"
    path.write_text('[dqn."*"]\nlr = 0.1\nbatch_size = 32\n[dqn."X-v0"]\nlr = 0.2\n')
    cfg = defaults_for("X-v0", "dqn", use_preset=True, path=path)
    assert (cfg.agent.lr, cfg.agent.batch_size) == (0.2, 32)
    assert defaults_for("Y-v0", "dqn", use_preset=True, path=path).agent.lr == 0.1
    path.write_text('[dqn."*"]\nlrr = 0.1\n')
    with pytest.raises(ValueError, match="preset for dqn on every env: 'lrr'"):
        defaults_for("Y-v0", "dqn", use_preset=True, path=path)


def test_preset_choice_reads_the_last_of_each_flag():
    argv = ["--env", "A", "--no-preset", "--algo=ppo", "--env=B", "--preset"]
    assert preset_choice(argv) == ("B", "ppo", True)
    assert preset_choice([]) == ("CartPole-v1", "dqn", True)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"lrr": 1.0}, "'lrr' is not a train setting"),
        ({"batch_size": "64"}, "batch_size must be int"),
        ({"env": "Other-v0"}, "'env' is not a train setting"),
        ({"algo": "ppo"}, "'algo' is not a train setting"),
    ],
)
def test_a_bad_preset_file_is_refused_by_name(tmp_path, entry, message):
    path = tmp_path / "presets.toml"
    lines = [f"{k} = {json.dumps(v)}" for k, v in entry.items()]
    path.write_text('[dqn."X-v0"]\n' + "\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        defaults_for("X-v0", "dqn", use_preset=True, path=path)


def test_a_table_that_names_no_algorithm_is_refused(tmp_path):
    path = tmp_path / "presets.toml"
    path.write_text('["X-v0"]\nlr = 0.1\n')
    with pytest.raises(ValueError, match=r"\[X-v0\] is not an algorithm"):
        load_presets(path)


def test_the_cli_reports_a_bad_flag_on_top_of_a_preset_in_one_line():
    with pytest.raises(CliError):
        parse_train(["--env", "Acrobot-v1", "--lr", "fast"])


def test_a_family_entry_reaches_every_env_of_the_family_below_its_own_entry(tmp_path):
    """MinAtar's games share MinAtar's reference DQN settings (`[dqn."MinAtar/*"]`)."""
    for game in ("MinAtar/Breakout-v1", "MinAtar/SpaceInvaders-v1"):
        cfg = parse_train(["--env", game])
        assert (cfg.agent.target_update_every, cfg.agent.double, cfg.total_steps) == (
            1_000, False, 500_000,
        ), game  # fmt: skip
    assert parse_train(["--env", "CartPole-v1"]).agent.target_update_every == 128
    path = tmp_path / "presets.toml"
    path.write_text('[dqn."*"]\nlr = 0.1\n[dqn."Fam/*"]\nlr = 0.2\nbatch_size = 16\n'
                    '[dqn."Fam/X-v0"]\nlr = 0.3\n')  # fmt: skip
    cfg = defaults_for("Fam/X-v0", "dqn", use_preset=True, path=path)
    assert (cfg.agent.lr, cfg.agent.batch_size) == (0.3, 16)
    assert defaults_for("Fam/Y-v0", "dqn", use_preset=True, path=path).agent.lr == 0.2
    assert defaults_for("Other/Y-v0", "dqn", use_preset=True, path=path).agent.lr == 0.1
    # Gymnasium's "module:" prefix is not part of the family (bench.envs' slow MinAtar Breakout).
    assert defaults_for("my.envs:Fam/Z-v0", "dqn", use_preset=True, path=path).agent.lr == 0.2
    assert defaults_for("my.envs:Fam/X-v0", "dqn", use_preset=True, path=path).agent.lr == 0.3
    # A namespaced id takes its base name's entry over its family's (bench.envs' Slow/Pendulum-v1).
    path.write_text('[dqn."Fam/*"]\nlr = 0.2\n[dqn."B-v0"]\nlr = 0.4\n')
    assert defaults_for("my.envs:Fam/B-v0", "dqn", use_preset=True, path=path).agent.lr == 0.4
    slow = parse_train(["--algo", "sac", "--env", "bench.envs:Slow/Pendulum-v1"])
    assert (slow.agent.lr, slow.total_steps) == (1e-3, 20_000)  # Pendulum-v1's SAC preset


def test_atari_games_take_rl_zoos_atari_dqn_in_this_learners_units():
    cfg = parse_train(["--env", "ALE/Pong-v5"])
    a = cfg.agent
    assert (a.lr, a.batch_size, a.buffer_size, a.learning_starts) == (1e-4, 32, 100_000, 100_000)
    # train_freq 4, one gradient step of 32: 8 sampled per inserted; a target copy every 1,000
    # env steps: 250 updates.
    assert (a.samples_per_insert, a.target_update_every, a.double) == (8.0, 250, False)
    assert (a.eps_end, a.eps_decay_steps, cfg.total_steps) == (0.01, 1_000_000, 10_000_000)
    assert (cfg.collection.chunk_steps, cfg.weights.reference_size) == (128, 32)


def test_the_continuous_control_envs_take_rl_zoos_sac_settings_and_their_box_actions():
    from clusterenv.learner.spaces import env_spaces

    lander = parse_train(["--algo", "sac", "--env", "LunarLander-v3"])
    assert lander.env_kwargs == {"continuous": True}  # RL-Zoo's LunarLanderContinuous
    assert (lander.agent.lr, lander.agent.tau, lander.agent.hidden) == (7.3e-4, 0.01, "400,300")
    assert env_spaces("LunarLander-v3", lander.env_kwargs, "sac")[0].action.dim == 2
    assert parse_train(["--algo", "sac", "--env", "Pendulum-v1"]).agent.lr == 1e-3
    pytest.importorskip("mujoco", reason="needs the mujoco extra")
    for env, dim in (("HalfCheetah-v5", 6), ("Hopper-v5", 3)):
        cfg = parse_train(["--algo", "sac", "--env", env])
        assert (cfg.agent.learning_starts, cfg.total_steps) == (10_000, 1_000_000)
        assert env_spaces(env, {}, "sac")[0].action.dim == dim
