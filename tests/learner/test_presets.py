"""Per-env presets: the shipped file is valid, flags override it, --no-preset ignores it."""

from __future__ import annotations

import json

import pytest

from clusterenv.learner.cli import CliError, parse_train
from clusterenv.learner.config import TrainConfig
from clusterenv.learner.presets import defaults_for, load_presets, preset_choice


@pytest.mark.parametrize("env", sorted(load_presets()))
def test_every_shipped_preset_applies_and_validates(env):
    cfg = defaults_for(env, use_preset=True)
    cfg.validate()
    changed = {k for k, v in load_presets()[env].items()}
    assert changed and cfg.env == env and cfg.preset


def test_the_envs_the_issue_names_have_presets():
    assert {"CartPole-v1", "Acrobot-v1", "LunarLander-v3", "MountainCar-v0"} <= set(load_presets())


def test_flags_override_the_preset_and_config_json_records_what_was_used():
    cfg = parse_train(["--env", "Acrobot-v1", "--lr", "1e-3"])
    assert cfg.dqn.lr == 1e-3  # the flag
    assert cfg.dqn.batch_size == 128 and cfg.replay.samples_per_insert == 128.0  # the preset
    recorded = json.loads(cfg.to_json())
    assert recorded["preset"] is True and recorded["dqn"]["batch_size"] == 128


def test_no_preset_gives_the_plain_defaults():
    plain = TrainConfig(env="Acrobot-v1")
    cfg = parse_train(["--env=Acrobot-v1", "--no-preset"])
    assert cfg.dqn == plain.dqn and cfg.replay == plain.replay and not cfg.preset


def test_an_env_without_an_entry_keeps_the_defaults():
    assert parse_train(["--env", "Pendulum-v1"]).dqn == TrainConfig().dqn


def test_preset_choice_reads_the_last_of_each_flag():
    assert preset_choice(["--env", "A", "--no-preset", "--env=B", "--preset"]) == ("B", True)
    assert preset_choice([]) == ("CartPole-v1", True)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"lrr": 1.0}, "'lrr' is not a train setting"),
        ({"batch_size": "64"}, "batch_size must be int"),
        ({"env": "Other-v0"}, "'env' is not a train setting"),
    ],
)
def test_a_bad_preset_file_is_refused_by_name(tmp_path, entry, message):
    path = tmp_path / "presets.toml"
    lines = [f"{k} = {json.dumps(v)}" for k, v in entry.items()]
    path.write_text('["X-v0"]\n' + "\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        defaults_for("X-v0", use_preset=True, path=path)


def test_the_cli_reports_a_bad_flag_on_top_of_a_preset_in_one_line():
    with pytest.raises(CliError):
        parse_train(["--env", "Acrobot-v1", "--lr", "fast"])
