"""docker/ checked without a Docker engine: compose files against the Compose specification's
JSON schema, every command and flag against the real entry point, the Dockerfile parsed.

Nothing here builds an image or starts a container (test_podman.py does, with podman, opt-in);
what is run for real here is: the Redis flags and the healthcheck against Debian's redis-server.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from importlib import import_module, resources
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from clusterenv.pipeline.cluster.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILES = ("compose.yaml", "compose.worker.yaml")
VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def env_example() -> dict[str, str]:
    lines = (DOCKER / ".env.example").read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR:?error}` and `$$`, on every string."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op and op.endswith("?"):
            raise KeyError(f"{name}: {arg}")
        return arg if op else ""

    return VAR.sub(one, value.replace("$$", "\0")).replace("\0", "$")


def compose(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load((DOCKER / name).read_text())
    return interpolate(raw, env_example() if env is None else env)


def services() -> dict[str, dict[str, Any]]:
    """Every service of both files, `extends` resolved (the extending service's keys win)."""
    out: dict[str, dict[str, Any]] = {}
    for name in COMPOSE_FILES:
        for svc_name, svc in compose(name)["services"].items():
            base = svc.pop("extends", None)
            if base:
                parent = dict(compose(base["file"])["services"][base["service"]])
                env = {**parent.get("environment", {}), **svc.pop("environment", {})}
                svc = {**parent, **svc, "environment": env}
            out[f"{name}:{svc_name}"] = svc
    return out


def compose_schema() -> dict[str, Any]:
    # The Compose specification's schema (Apache-2.0), as check-jsonschema ships it.
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads((vendor / "compose-spec.json").read_text())


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_files_match_the_compose_schema(name):
    validator = jsonschema.Draft202012Validator(compose_schema())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose(name))]
    assert not errors, errors
    # And the check can fail: a misspelt key is caught.
    bad = compose(name)
    next(iter(bad["services"].values()))["stop_grace"] = "30s"
    assert not validator.is_valid(bad)


def test_env_example_covers_every_variable_and_nothing_else():
    text = "".join((DOCKER / name).read_text() for name in COMPOSE_FILES)
    used = {m.group(1) for m in VAR.finditer(text)}
    required = {m.group(1) for m in VAR.finditer(text) if m.group(2) in (":?", "?", None)}
    # Variables the containers read themselves ($$) are set in `environment`, not in .env.
    assert required <= set(env_example()), required - set(env_example())
    assert set(env_example()) <= used, set(env_example()) - used
    with pytest.raises(KeyError, match="REDIS_PASSWORD"):
        compose("compose.yaml", {})


def check_celery(argv: list[str]) -> None:
    """`celery -A APP SUBCOMMAND ...`: the app imports, and the flags parse as celery's do."""
    from celery.bin.base import CLIContext
    from celery.bin.celery import celery

    assert argv[:2] == ["-A", "clusterenv.tasks"], argv
    app = import_module(argv[1]).app
    sub, rest = argv[2], argv[3:]
    ctx = celery.make_context("celery", argv[:3])
    ctx.obj = CLIContext(app=app, no_color=True, workdir=None, quiet=True)
    if sub == "worker":
        celery.commands["worker"].make_context("worker", rest, parent=ctx)  # UsageError if bad
    elif sub == "flower":
        from flower.options import options

        for flag in rest:
            assert flag.split("=")[0].removeprefix("--") in options._options, flag
    else:
        raise AssertionError(f"unexpected celery subcommand {sub}")


def check_clusterenv(argv: list[str]) -> None:
    from clusterenv.learner.config import TrainConfig
    from clusterenv.learner.tools.cli import parse

    assert argv[0] == "train", argv
    cfg = parse(TrainConfig, argv[1:], "clusterenv train")
    cfg.validate()
    assert cfg.workers == 0 and cfg.redis_url and cfg.redis_url.startswith("redis://:")


def check_command(argv: list[str]) -> None:
    if argv[0] == "celery":
        check_celery(argv[1:])
    elif argv[0] == "clusterenv":
        if argv[1:] == ["train", "--help"]:
            return
        check_clusterenv(argv[1:])
    elif argv[0] == "redis-server":
        pass  # run for real in test_redis_flags_and_healthcheck_work_on_a_real_server
    else:
        raise AssertionError(f"no known entry point for {argv}")


def test_every_command_resolves_to_a_real_entry_point():
    for name, svc in services().items():
        if "command" in svc:
            check_command(svc["command"])
        for key in svc.get("environment", {}):
            if key.startswith("CLUSTERENV_"):  # read by celeryconfig.py
                assert key in (ROOT / "celeryconfig.py").read_text(), (name, key)
    with pytest.raises(click.UsageError):
        check_celery(["-A", "clusterenv.tasks", "worker", "--concurrencyy=2"])
    with pytest.raises(AssertionError):
        check_celery(["-A", "clusterenv.tasks", "flower", "--basic-auht=a:b"])


def test_flower_asks_for_a_login_and_stays_local():
    from flower.options import options

    flower = services()["compose.yaml:flower"]
    name = "FLOWER_BASIC_AUTH".removeprefix("FLOWER_").lower().replace("_", "-")
    assert name in options._options  # Flower reads FLOWER_<option> from the environment
    assert flower["environment"]["FLOWER_BASIC_AUTH"].count(":") == 1
    raw = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    assert raw["flower"]["ports"][0].startswith("${FLOWER_BIND:-127.0.0.1}:")
    assert raw["redis"]["ports"][0].startswith("${REDIS_BIND:-127.0.0.1}:")


def test_workers_scale_and_the_learner_keeps_its_runs():
    svcs = services()
    for key in ("compose.yaml:worker", "compose.worker.yaml:worker"):
        worker = svcs[key]
        assert "container_name" not in worker  # `--scale worker=N` needs distinct names
        grace = worker["stop_grace_period"]
        assert grace.endswith("s") and int(grace[:-1]) >= 10  # a chunk takes well under 1 s
    learner = svcs["compose.yaml:learner"]
    assert learner["volumes"] == ["runs:/home/clusterenv/runs"]
    assert "--run-dir" in learner["command"] and "runs" in learner["command"]
    assert "runs" in compose("compose.yaml")["volumes"]


def dockerfile_stages() -> dict[str, list[dict[str, Any]]]:
    parser = DockerfileParser(path=str(DOCKER / "Dockerfile"))
    stages: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] = []
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            current = stages.setdefault(ins["value"].split()[-1], [])
        current.append(ins)
    return stages


def test_dockerfile_parses_and_copies_what_exists():
    known = {"FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "CMD", "COMMENT", "ARG"}
    stages = dockerfile_stages()
    for name, body in stages.items():
        for ins in body:
            assert ins["instruction"] in known, (name, ins)
            if ins["instruction"] == "COPY":
                for src in ins["value"].split()[:-1]:
                    assert (ROOT / src).exists(), src
            if ins["instruction"] == "CMD":
                check_command(json.loads(ins["value"]))
    targets = {svc["build"]["target"] for svc in services().values() if "build" in svc}
    assert targets == {"worker", "learner"} and targets <= set(stages)
    worker_runs = " ".join(i["value"] for i in stages["worker"] if i["instruction"] == "RUN")
    assert "torch" not in worker_runs and "learner" not in worker_runs
    learner_runs = " ".join(i["value"] for i in stages["learner"] if i["instruction"] == "RUN")
    pin = re.search(r'"torch==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f"torch=={pin}" in learner_runs


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs Debian's redis-server")
def test_redis_flags_and_healthcheck_work_on_a_real_server(tmp_path):
    redis = services()["compose.yaml:redis"]
    command, password = redis["command"], redis["environment"]["REDISCLI_AUTH"]
    assert command[command.index("--requirepass") + 1] == password
    port = free_port()
    server = subprocess.Popen(
        [*command, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        check = redis["healthcheck"]["test"][1].replace("redis-cli", f"redis-cli -p {port}")

        def healthy(secret: str) -> bool:
            auth = {"REDISCLI_AUTH": secret, "PATH": "/usr/bin:/bin"}
            return subprocess.run(["sh", "-c", check], env=auth, timeout=10).returncode == 0

        deadline = time.monotonic() + 20
        while not healthy(password):
            assert server.poll() is None, server.stdout.read().decode()
            assert time.monotonic() < deadline, "redis never became healthy"
            time.sleep(0.2)
        assert not healthy("wrong-password")
        policy = subprocess.run(
            ["redis-cli", "-p", str(port), "config", "get", "maxmemory-policy"],
            env={"REDISCLI_AUTH": password}, capture_output=True, text=True,
            timeout=10,
        )  # fmt: skip
        assert policy.stdout.split() == ["maxmemory-policy", "noeviction"]
    finally:
        server.terminate()
        server.wait(timeout=10)
