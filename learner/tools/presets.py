"""Per-env presets: the shipped hyperparameter file (learner/tools/presets.toml) applied to a
TrainConfig.

A table `[ALGO."ENV"]` holds one env's values; `[ALGO."*"]` holds values for every env of that
algorithm, applied first, then `[ALGO."FAMILY/*"]` for the envs whose id starts with `FAMILY/`
(MinAtar's games), so an env's own entry and then the flags override them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from clusterenv.learner.config import AGENT_CONFIGS, TrainConfig

PRESETS_FILE = Path(__file__).with_name("presets.toml")
EVERY_ENV = "*"


def load_presets(path: Path = PRESETS_FILE) -> dict[str, dict[str, dict[str, Any]]]:
    """{algo: {env id or "*": {flag name: value}}} from the presets file."""
    with open(path, "rb") as f:
        presets = tomllib.load(f)
    for algo in presets:
        if algo not in AGENT_CONFIGS:
            raise ValueError(f'{path}: [{algo}] is not an algorithm; tables are [ALGO."ENV"]')
    return presets


def apply_preset(cfg: TrainConfig, values: dict[str, Any], env: str) -> None:
    """Set each preset value on `cfg` (in place), refusing unknown names and wrong types."""
    settings = cfg.settings()
    for name, value in values.items():
        if name not in settings or name in ("env", "algo", "preset"):
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


def defaults_for(env: str, algo: str, use_preset: bool, path: Path = PRESETS_FILE) -> TrainConfig:
    """The config that flags are parsed on top of: the defaults, then `algo`'s values for every
    env, for the env's family (`"FAMILY/*"`, e.g. `"MinAtar/*"`), for its name without the
    family (`"Slow/Pendulum-v1"` takes `"Pendulum-v1"`'s) and its own entry for `env`, where the
    file has them, each over the one before."""
    cfg = TrainConfig.for_algo(algo, env=env, preset=use_preset)
    tables = load_presets(path).get(algo, {}) if use_preset else {}
    # Gymnasium's "module:" prefix (an id registered on import, e.g. a bench's
    # "bench.envs:MinAtar/SlowBreakout-v1") is not part of the id the file names.
    plain = env.rpartition(":")[2]
    namespace, _, name = plain.rpartition("/")
    family, base = (f"{namespace}/*", name) if namespace else (None, None)
    for key, where in ((EVERY_ENV, f"{algo} on every env"), (family, f"{algo} on {family}"),
                       (base, f"{algo} on {base}"), (plain, f"{algo} on {plain}")):  # fmt: skip
        if key is not None and tables.get(key):
            apply_preset(cfg, tables[key], where)
    return cfg


def preset_choice(argv: list[str]) -> tuple[str, str, bool]:
    """The env id, algorithm and preset switch given in `argv` (the last of each wins, as in the
    parser)."""
    found = {"env": TrainConfig.env, "algo": TrainConfig.algo}
    use = TrainConfig.preset
    for i, arg in enumerate(argv):
        for name in found:
            if arg == f"--{name}" and i + 1 < len(argv):
                found[name] = argv[i + 1]
            elif arg.startswith(f"--{name}="):
                found[name] = arg.removeprefix(f"--{name}=")
        if arg in ("--preset", "--no-preset"):
            use = arg == "--preset"
    return found["env"], found["algo"], use
