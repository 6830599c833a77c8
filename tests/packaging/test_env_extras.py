"""Each pixel-env family of pipeline/envs names an extra of pyproject.toml that installs its
packages, and the test extra includes it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from clusterenv.pipeline.envs import FAMILIES

PYPROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_every_family_has_its_extra_and_the_tests_install_it():
    extras = PYPROJECT["project"]["optional-dependencies"]
    (self_extras,) = [r for r in extras["test"] if r.startswith("clusterenv[")]
    for family in FAMILIES:
        assert names(extras[family.extra]) == set(family.packages.values()), family
        assert family.extra in self_extras.removeprefix("clusterenv[").rstrip("]").split(",")
    # None of them in the worker's base install.
    base = names(PYPROJECT["project"]["dependencies"])
    assert not base & {p for f in FAMILIES for p in f.packages.values()}
