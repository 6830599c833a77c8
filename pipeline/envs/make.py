"""make_env: a plain Gymnasium id as gym.make gives it; the pixel families (MinAtar, Atari) with
the wrappers their agents expect, training or evaluating."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

import gymnasium as gym


@dataclass(frozen=True)
class Family:
    """Envs whose ids start with `prefix`, made by `maker` once the modules of `packages`
    import; the `extra` of clusterenv that installs those."""

    prefix: str
    extra: str
    packages: dict[str, str]  # module: the pip package that installs it
    maker: str  # a module of this package exposing make(env_id, env_kwargs, training, render_mode)


FAMILIES = (
    Family("MinAtar/", "minatar", {"minatar": "minatar"}, "minatar"),
    # cv2: AtariPreprocessing's resize.
    Family("ALE/", "atari", {"ale_py": "ale-py", "cv2": "opencv-python-headless"}, "atari"),
)


def family_of(env_id: str) -> Family | None:
    return next((f for f in FAMILIES if env_id.startswith(f.prefix)), None)


def _maker(family: Family) -> Callable[..., gym.Env]:
    missing = []
    for module, package in family.packages.items():
        try:
            import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        # A gym.error.Error, so callers that name the env for gym.make's own errors name it here too.
        raise gym.error.DependencyNotInstalled(
            f"{family.prefix}* envs need {', '.join(missing)}: pip install 'clusterenv[{family.extra}]'"
        )
    return import_module(f"clusterenv.pipeline.envs.{family.maker}").make


def make_env(
    env_id: str,
    env_kwargs: dict[str, Any],
    *,
    training: bool,
    render_mode: str | None = None,
) -> gym.Env:
    """One env of `env_id` with keyword arguments `env_kwargs`. A plain Gymnasium id is
    `gym.make(env_id, **env_kwargs)` (with `render_mode` when given); `MinAtar/...` and `ALE/...`
    ids get their family's wrappers, which differ between collection (`training`) and
    evaluation (see pipeline/envs/atari.py). gym.error.Error for an unknown id or a family whose
    packages are missing (the message names the extra), TypeError for kwargs it does not take."""
    family = family_of(env_id)
    if family is None:
        render = {} if render_mode is None else {"render_mode": render_mode}
        return gym.make(env_id, **env_kwargs, **render)
    return _maker(family)(env_id, env_kwargs, training=training, render_mode=render_mode)
