"""Per-env presets: the shipped hyperparameter file (learner/presets.toml) applied to TrainConfig."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from clusterenv.learner.config import TrainConfig

PRESETS_FILE = Path(__file__).with_name("presets.toml")


def load_presets(path: Path = PRESETS_FILE) -> dict[str, dict[str, Any]]:
    """{env id: {flag name: value}} from the presets file."""
    with open(path, "rb") as f:
        return tomllib.load(f)


def apply_preset(cfg: TrainConfig, values: dict[str, Any], env: str) -> None:
    """Set each preset value on `cfg` (in place), refusing unknown names and wrong types."""
    settings = cfg.settings()
    for name, value in values.items():
        if name not in settings or name in ("env", "preset"):
            raise ValueError(f"preset for {env}: {name!r} is not a train setting")
        holder, attr = settings[name]
        current = getattr(holder, attr)
        if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if current is not None and type(value) is not type(current):
            raise ValueError(
                f"preset for {env}: {name} must be {type(current).__name__}, got {value!r}"
            )
        setattr(holder, attr, value)


def defaults_for(env: str, use_preset: bool, path: Path = PRESETS_FILE) -> TrainConfig:
    """The config that flags are parsed on top of: the defaults, with `env`'s preset if any."""
    cfg = TrainConfig(env=env, preset=use_preset)
    presets = load_presets(path) if use_preset else {}
    if env in presets:
        apply_preset(cfg, presets[env], env)
    return cfg


def preset_choice(argv: list[str]) -> tuple[str, bool]:
    """The env id and preset switch given in `argv` (the last of each wins, as in the parser)."""
    env, use = TrainConfig.env, TrainConfig.preset
    for i, arg in enumerate(argv):
        if arg == "--env" and i + 1 < len(argv):
            env = argv[i + 1]
        elif arg.startswith("--env="):
            env = arg.removeprefix("--env=")
        elif arg in ("--preset", "--no-preset"):
            use = arg == "--preset"
    return env, use
