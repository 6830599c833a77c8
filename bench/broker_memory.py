"""Bounded broker memory: a long `clusterenv train` with N local workers against a server of this
benchmark's own, its Redis `used_memory` sampled every few seconds, each of the run's keys sized
by kind (MEMORY USAGE), and once the run has ended every key of the run checked for an expiry.

    python -m bench.broker_memory --minutes 30 --workers 8 --plot docs/img/broker_memory.png

The bound it checks is derived from the run's settings and the sizes of one key of each kind
(docs/benchmarks.md, "Broker memory"): the weight versions kept, with their probes; the
reference batches a kept version can point to; the chunks in flight, which the stream holds until
the learner acknowledges them (it deletes each entry as it acknowledges it), twice over for an
ingest backlog; the small keys (status, takers, evaluation results, counters).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from bench.common import TRAIN, mark_start, save_figure, table, write_results
from bench.signals import default_stop_signals
from clusterenv.learner.config import TrainConfig
from clusterenv.pipeline.cluster.embedded import EmbeddedServer
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys

KINDS = ("weights", "probe", "reference", "chunks", "other")


def kind_of(key: str, keys: RunKeys) -> str:
    rest = key[len(keys.base) + 1 :]
    name = rest.split(":")[0]
    if name == "weights" and rest != "weights:latest":
        return "weights"
    return name if name in ("probe", "reference", "chunks") else "other"


def run_keys(client: redis.Redis, run_id: str) -> list[str]:
    return [k.decode() for k in client.scan_iter(match=f"{RunKeys(run_id).base}:*", count=1000)]


def sample(client: redis.Redis, run_id: str | None, t0: float) -> dict[str, Any]:
    info = client.info("memory")
    row: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 1),
                           "used_memory": info["used_memory"],
                           "used_memory_dataset": info.get("used_memory_dataset"),
                           "stream_len": 0}  # fmt: skip
    by_kind: dict[str, list[int]] = defaultdict(list)
    if run_id is not None:
        keys = RunKeys(run_id)
        for key in run_keys(client, run_id):
            size = client.memory_usage(key, samples=0)
            if size is not None:
                by_kind[kind_of(key, keys)].append(size)
        row["stream_len"] = client.xlen(keys.stream) if client.exists(keys.stream) else 0
    for kind in KINDS:
        row[f"{kind}_keys"] = len(by_kind[kind])
        row[f"{kind}_bytes"] = sum(by_kind[kind])
        row[f"{kind}_max_key"] = max(by_kind[kind], default=0)
    return row


def chunk_bytes(workers_log: Path) -> int:
    """The largest stream entry a worker wrote, as its task summaries in the log say."""
    return max(
        int(b) for b in re.findall(r'"bytes": (\d+)', workers_log.read_text(errors="replace"))
    )


def derive_bound(
    cfg: TrainConfig, workers: int, rows: list[dict[str, Any]], entry_bytes: int
) -> dict[str, int]:
    """The run's keys at most, in bytes, from its settings and the largest key of each kind seen."""
    big = {kind: max(r[f"{kind}_max_key"] for r in rows) for kind in KINDS}
    w, d = cfg.weights, cfg.dispatch
    in_flight = d.tasks_per_process * d.chunks_per_task * workers
    # Every chunk in flight written and not yet acknowledged, twice over (an ingest backlog), with
    # a quarter more for the stream's own structure.
    per_entry = 1.25 * entry_bytes
    parts = {
        "weights": w.weights_kept * big["weights"],
        "probe": w.weights_kept * big["probe"],
        # The kept versions span weights_kept / reference_every refreshes, plus the newest.
        "reference": (math.ceil(w.weights_kept / w.reference_every) + 2) * big["reference"],
        "chunks": int(2 * in_flight * per_entry),
        "other": 64 * 1024,
    }
    parts["total"] = sum(parts.values())
    return parts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.broker_memory",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument(
        "--minutes", type=float, default=30.0, help="how long the run trains (default: 30)"
    )
    p.add_argument("--workers", type=int, default=8, help="local worker processes (default: 8)")
    p.add_argument("--env", default="CartPole-v1", help="env id (default: CartPole-v1)")
    p.add_argument(
        "--every-s", type=float, default=10.0, help="seconds between samples (default: 10)"
    )
    p.add_argument("--plot", type=Path, help="write the memory curve as a PNG here")
    p.add_argument(
        "--out", type=Path, help="results JSON (default: bench/results/broker_memory.json)"
    )
    args = p.parse_args(argv)
    mark_start()
    server = EmbeddedServer()
    url = server.start()
    client = connect(url)
    cfg = TrainConfig(env=args.env)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        flags = ["--env", args.env, "--redis-url", url, "--workers", str(args.workers),
                 "--total-steps", str(10**10), "--target-return", "1e9", "--run-dir", tmp]  # fmt: skip
        # Its stderr to a file: a pipe nobody reads for 30 minutes could fill and stall it.
        log = open(Path(tmp) / "learner.log", "w+")  # noqa: SIM115 (closed with the folder)
        learner = subprocess.Popen([*TRAIN, *flags], stderr=log, text=True,
                                   preexec_fn=default_stop_signals)  # fmt: skip
        try:
            t0, run_id = time.monotonic(), None
            baseline = sample(client, None, t0)["used_memory"]
            while time.monotonic() - t0 < args.minutes * 60:
                assert learner.poll() is None, "the learner stopped early (its log: learner.log)"
                if run_id is None:
                    found = [d.name for d in Path(tmp).iterdir() if d.is_dir()]
                    run_id = found[0] if found else None
                rows.append(sample(client, run_id, t0))
                print(f"{rows[-1]['t_s']:7.0f} s  used_memory {rows[-1]['used_memory'] / 2**20:7.2f} MiB"
                      f"  stream {rows[-1].get('stream_len', 0)}", flush=True)  # fmt: skip
                time.sleep(args.every_s)
            # An operator stops it: summary, keys expire. SIGTERM, not SIGINT: a background job
            # starts with SIGINT ignored, and so did the learner of the first soak (stopped by
            # hand two minutes late).
            learner.send_signal(signal.SIGTERM)
            learner.wait(timeout=300)
            log.seek(0)
            err = log.read()
        finally:
            if learner.poll() is None:
                learner.kill()
        summary_path = next(Path(tmp).glob("*/summary.json"))
        summary = json.loads(summary_path.read_text())
        entry_bytes = chunk_bytes(summary_path.parent / "workers.log")
    after = {k: client.ttl(k) for k in run_keys(client, run_id)}
    no_expiry = sorted(k for k, ttl in after.items() if ttl == -1)
    other = sorted(k.decode() for k in client.scan_iter(count=1000)
                   if not k.decode().startswith(RunKeys(run_id).base))  # fmt: skip
    server.stop()
    bound = derive_bound(cfg, args.workers, rows, entry_bytes)
    peak = max(r["used_memory"] for r in rows)
    run_peak = max(sum(r[f"{k}_bytes"] for k in KINDS) for r in rows)
    result = {
        "minutes": args.minutes, "workers": args.workers, "env": args.env,
        "env_steps": summary["env_steps"], "updates": summary["updates"],
        "policy_versions": summary["policy_versions"],
        "baseline_used_memory": baseline, "peak_used_memory": peak,
        "peak_run_key_bytes": run_peak, "chunk_entry_bytes": entry_bytes, "bound": bound,
        "within_bound": run_peak <= bound["total"],
        "keys_after_end": len(after), "keys_without_expiry": no_expiry,
        "other_keys_after_end": other, "samples": rows, "learner_stderr_tail": err[-2000:],
    }  # fmt: skip
    path = write_results("broker_memory", result, args.out)
    print(table([{"kind": k, "peak keys": max(r[f"{k}_keys"] for r in rows),
                  "peak bytes": max(r[f"{k}_bytes"] for r in rows), "bound bytes": bound[k]}
                 for k in KINDS], ["kind", "peak keys", "peak bytes", "bound bytes"]))  # fmt: skip
    print(f"used_memory: baseline {baseline / 2**20:.2f} MiB, peak {peak / 2**20:.2f} MiB; run's "
          f"keys peak {run_peak / 2**20:.2f} MiB against a bound of {bound['total'] / 2**20:.2f} MiB; "
          f"{len(no_expiry)} of the run's {len(after)} keys without an expiry after its end; "
          f"{summary['env_steps']:,} env steps, {summary['policy_versions']:,} versions -> {path}")  # fmt: skip
    if args.plot:
        plot(rows, bound, baseline, args.plot)
    return 0 if result["within_bound"] and not no_expiry else 1


def plot(rows: list[dict[str, Any]], bound: dict[str, int], baseline: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] / 60 for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(t, [r["used_memory"] / 2**20 for r in rows], label="used_memory (server)", color="k")
    ax.stackplot(t, *[[r[f"{k}_bytes"] / 2**20 for r in rows] for k in KINDS],
                 labels=[f"run keys: {k}" for k in KINDS], alpha=0.6)  # fmt: skip
    ax.axhline((baseline + bound["total"]) / 2**20, ls="--", color="r",
               label="bound: baseline + derived run keys")  # fmt: skip
    ax.set_xlabel("minutes")
    ax.set_ylabel("MiB")
    ax.set_title("Broker memory over a long run")
    ax.legend(fontsize=8, loc="lower right")
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
