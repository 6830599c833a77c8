"""One import namespace: pipeline/, tasks/, learner/ and celeryconfig.py install as `clusterenv.*`,
and nothing of ours imports them (or runs celery on them) by their bare top-level names."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("pipeline", "tasks", "learner")
BARE_IMPORT = re.compile(rf"^\s*(from|import) ({'|'.join(TOPS)}|celeryconfig)\b", re.M)
BARE_APP = re.compile(r"-A[ =]tasks\b(?!\.)|[\"']-A[\"'],\s*[\"']tasks[\"']")


def tracked(*suffixes: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.splitlines() if p.endswith(suffixes)]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        "clusterenv." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in TOPS
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert listed == on_disk | {"clusterenv"}


def test_nothing_uses_the_bare_top_level_names():
    found = []
    for path in tracked(".py", ".md", ".toml", ".yaml", ".cfg"):
        text = path.read_text()
        for rx in (BARE_IMPORT, BARE_APP):
            found += [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for m in rx.finditer(text)]
    assert not found, found
    top, app = "pipeline", "tasks"  # (spelt so that the codemod leaves these examples alone)
    assert BARE_IMPORT.search(f"from {top}.keys import RunKeys")  # the check can fail
    assert BARE_APP.search(f'["-m", "celery", "-A", "{app}", "worker"]')


def test_the_package_comes_from_this_checkout():
    import clusterenv.celeryconfig
    import clusterenv.pipeline
    import clusterenv.tasks

    for mod, path in [
        (clusterenv.celeryconfig, "celeryconfig.py"),
        (clusterenv.pipeline, "pipeline/__init__.py"),
        (clusterenv.tasks, "tasks/__init__.py"),
    ]:
        # The tests test this checkout: an editable install (`pip install -e`), not a stale copy.
        assert Path(mod.__file__).resolve() == ROOT / path, mod.__file__
    assert clusterenv.tasks.app.main == "clusterenv"


@pytest.mark.slow
def test_the_wheel_holds_the_namespace_and_nothing_else(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("clusterenv-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {n for n in names if n.endswith(".py")}
    expected = {"clusterenv/celeryconfig.py"} | {
        "clusterenv/" + str(p.relative_to(ROOT)) for top in TOPS for p in (ROOT / top).rglob("*.py")
    }
    assert modules == expected, modules ^ expected
    tops = {n.split("/")[0] for n in names} - {"clusterenv"}
    assert len(tops) == 1 and tops.pop().endswith(".dist-info")  # no top-level module of ours
