"""docker/'s autoscaling recipes: the KEDA ScaledObject against KEDA's own resource model, and the
plain-compose autoscaler (docker/autoscale.py) reading a real learner metrics endpoint."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject

from clusterenv.learner.run.prometheus import Figures, RunGauges, serve_metrics

DOCKER = Path(__file__).resolve().parents[2] / "docker"
# The Prometheus scaler's settings (KEDA 2.x docs, "Prometheus" scaler): required, then optional.
PROMETHEUS_KEYS = {"serverAddress", "query", "threshold"}
PROMETHEUS_OPTIONAL = {"activationThreshold", "namespace", "customHeaders", "ignoreNullValues",
                       "unsafeSsl", "queryParameters"}  # fmt: skip


def autoscale_module():
    spec = importlib.util.spec_from_file_location("autoscale", DOCKER / "autoscale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scaled_object_matches_kedas_resource_model():
    raw = yaml.safe_load((DOCKER / "autoscaling" / "keda-scaledobject.yaml").read_text())
    # cloudcoil's models are generated from KEDA's CRDs; they drop keys they do not know, so a
    # round trip that loses nothing shows every key is one KEDA defines.
    model = ScaledObject.model_validate(raw)
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == raw
    (trigger,) = raw["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    keys = set(trigger["metadata"])
    assert PROMETHEUS_KEYS <= keys <= PROMETHEUS_KEYS | PROMETHEUS_OPTIONAL
    assert float(trigger["metadata"]["threshold"]) > 0
    assert raw["spec"]["minReplicaCount"] >= 1  # from zero workers the learner sends nothing


def test_the_scaled_objects_query_names_a_metric_the_learner_serves():
    raw = yaml.safe_load((DOCKER / "autoscaling" / "keda-scaledobject.yaml").read_text())
    query = raw["spec"]["triggers"][0]["metadata"]["query"]
    served = {family.name for family in RunGauges({}).collect()}
    # Counters are served with _total added; the query reads a gauge by its plain name.
    assert any(name in query for name in served if name.startswith("clusterenv_chunks")), query


@pytest.mark.parametrize(
    "replicas,per_worker,want",
    [
        (2, 2.0, 3),  # saturated: 2 per process against a target of 1.5 -> a third more
        (3, 2.0, 4),
        (8, 0.5, 3),  # the learner's rate limiter holds collection back: fewer will do
        (8, 0.05, 1),  # never below --min
        (6, 2.0, 8),  # 6 * 2 / 1.5 = 8, --max itself
        (8, 2.0, 8),  # 10.7, capped at --max
        (0, 0.0, 1),  # nothing running: --min
        (4, 0.0, 4),  # no live process yet (starting): keep what runs
        (4, 1.5, 4),  # on target: no change
    ],
)
def test_the_autoscaler_asks_for_the_hpas_replica_count(replicas, per_worker, want):
    assert autoscale_module().desired_workers(replicas, per_worker, 1.5, 1, 8) == want


def test_the_autoscaler_reads_a_real_endpoint_and_prints_the_compose_command():
    server = serve_metrics("127.0.0.1", 0)
    gauges = RunGauges({"run_id": "r", "env": "CartPole-v1", "algo": "dqn"})
    server.registry.register(gauges)
    try:
        gauges.refresh(Figures(chunks_in_flight=8, live_workers=4))  # 2 per process: saturated
        out = subprocess.run(
            [sys.executable, str(DOCKER / "autoscale.py"), "--metrics-url",
             f"http://127.0.0.1:{server.port}/metrics", "--once", "--dry-run", "--replicas", "2",
             "--compose", "docker compose -f docker/compose.yaml"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    assert "2 workers, 2.00 chunks per process -> 3" in out.stderr
    assert out.stdout.strip() == (
        "docker compose -f docker/compose.yaml up --detach --no-recreate --scale worker=3 worker"
    )


def test_the_autoscaler_waits_out_a_learner_that_is_not_up():
    out = subprocess.run(
        [sys.executable, str(DOCKER / "autoscale.py"), "--metrics-url",
         "http://127.0.0.1:1/metrics", "--once", "--dry-run", "--replicas", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0 and "cannot read http://127.0.0.1:1/metrics" in out.stderr
    assert out.stdout == ""
