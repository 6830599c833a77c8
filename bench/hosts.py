"""Bytes become time: sync rules on the network-namespace rig, at two round trips and a capped link.

The rig (bench/netrig.py, root and `ip netns` needed) puts the broker, the learner and each worker
host in a namespace of its own; the broker is reached through a proxy that delays each direction
by half the round trip, and `tbf` caps the broker's link. For each network condition and sync
rule, one `clusterenv train` (in the learner's namespace, `--workers 0`, one celery worker per
host) runs a fixed env-step budget; per run: env steps/s over the run's wall time, weight bytes
and fetches (summed over workers), probe bytes, policy lag.

    python -m bench.hosts                                   # the full grid (4 hosts, ~15 min)
    python -m bench.hosts --hosts 2 --total-steps 2000 --rules on-change --conditions rtt2 \\
        --out /tmp/hosts.json --plot /tmp/hosts.png         # a smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, mark_start, save_figure, table, write_results
from bench.netrig import NetRig, unavailable
from clusterenv.pipeline.cluster.embedded import LocalWorkers

RULES = ["on-change", "interval:1024", "aps:0.01"]
# name -> (one-way delay in ms, cap on the broker's link in Mbit/s or None)
CONDITIONS: dict[str, tuple[float, float | None]] = {
    "rtt2": (1.0, None),
    "rtt20": (10.0, None),
    "rtt2+cap50": (1.0, 50.0),
}


def wait_registered(rig: NetRig, pools: list[LocalWorkers], timeout_s: float = 120.0) -> None:
    """Until every pool's workers announce themselves on the rig's broker."""
    deadline = time.monotonic() + timeout_s
    while True:
        keys = rig.redis_cli("keys", "clusterenv:worker:*")
        if all(keys.count(p.tag) == p.count for p in pools):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers did not register within {timeout_s:.0f} s: {keys}")
        time.sleep(0.2)


def run_one(rig: NetRig, rule: str, total_steps: int, flags: list[str], hosts: int) -> dict:
    parent = rig.root / "runs" / f"{rule.replace(':', '_')}-{time.time_ns()}"
    argv = [sys.executable, "-m", "clusterenv.learner.tools.cli", "train", "--redis-url", rig.broker_url,
            "--workers", "0", "--sync", rule, "--total-steps", str(total_steps),
            "--target-return", "1e9", "--eval-every", str(total_steps), "--eval-episodes", "1",
            "--run-dir", str(parent), *flags]  # fmt: skip
    log = rig.root / "learner.log"
    proc = rig.popen(rig.learner, argv, log=log)
    if proc.wait(timeout=3600) != 0:
        raise RuntimeError(f"run failed ({proc.returncode}): {log.read_text()[-2000:]}")
    (run_dir,) = [p for p in parent.iterdir() if p.is_dir()]
    s = json.loads((run_dir / "summary.json").read_text())
    sync = s["sync_total"]
    return {
        "rule": rule, "env_steps": s["env_steps"], "wall_s": s["wall_s"],
        "steps_per_s": s["env_steps"] / s["wall_s"],
        "weight_MB": sync.get("weight_bytes", 0) / 1e6,
        "weight_fetches": sync.get("weight_fetches", 0),
        "probe_MB": sync.get("probe_bytes", 0) / 1e6,
        "weight_MB_per_s": sync.get("weight_bytes", 0) / 1e6 / s["wall_s"],
        "versions": s["policy_versions"], "lag_updates_mean": s["lag"]["lag_updates_mean"],
        "hosts": hosts,
    }  # fmt: skip


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with NetRig(workers=args.hosts, root=args.rig_dir / f"rig-{time.time_ns()}") as rig:
        for name in args.conditions.split(","):
            one_way_ms, mbit = CONDITIONS[name]
            rig.set_delay(one_way_ms)
            rig.cap_broker(mbit)
            pools = [rig.workers(h, args.workers_per_host) for h in rig.hosts]
            try:
                wait_registered(rig, pools)
                for rule in args.rules.split(","):
                    row = {"condition": name, "rtt_ms": 2 * one_way_ms, "cap_mbit": mbit}
                    row |= run_one(rig, rule, args.total_steps, args.flags.split(), args.hosts)
                    rows.append(row)
                    print(f"{name:>11} {rule:>14}: {row['steps_per_s']:.0f} steps/s, "
                          f"{row['weight_MB']:.1f} MB weights", flush=True)  # fmt: skip
            finally:
                for pool in pools:
                    pool.stop()
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Env steps/s and weight MB per rule, one group of bars per network condition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    rules = list(dict.fromkeys(r["rule"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(rules)
    for ax, key, label in ((axes[0], "steps_per_s", "env steps/s"),
                           (axes[1], "weight_MB", "weight MB fetched (all workers)")):  # fmt: skip
        for j, rule in enumerate(rules):
            values = [next((r[key] for r in rows if r["condition"] == c and r["rule"] == rule), 0)
                      for c in conditions]  # fmt: skip
            ax.bar([i + j * width for i in range(len(conditions))], values, width, label=rule)
        ax.set_xticks([i + width * (len(rules) - 1) / 2 for i in range(len(conditions))])
        ax.set_xticklabels(conditions)
        ax.set_ylabel(label)
    axes[0].legend()
    hosts = rows[0]["hosts"] if rows else 0
    fig.suptitle(f"Sync rules across {hosts} worker hosts: round trip and a capped broker link")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=4, help="worker hosts (namespaces)")
    p.add_argument("--workers-per-host", type=int, default=1)
    p.add_argument("--rules", default=",".join(RULES), help="comma-separated --sync specs")
    p.add_argument("--conditions", default=",".join(CONDITIONS), help=f"of {list(CONDITIONS)}")
    p.add_argument("--total-steps", type=int, default=20_000, help="env-step budget per run")
    p.add_argument("--flags", default="", help="more `clusterenv train` flags, space-separated")
    p.add_argument("--rig-dir", type=Path, default=Path("runs/bench-hosts"), help="logs and runs")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "hosts.json")
    p.add_argument("--plot", type=Path, default=Path("docs/img/hosts.png"))
    args = p.parse_args(argv)
    reason = unavailable()
    if reason:
        print(f"bench.hosts needs the network-namespace rig: {reason}", file=sys.stderr)
        return 2
    unknown = set(args.conditions.split(",")) - set(CONDITIONS)
    if unknown:
        p.error(f"unknown conditions {sorted(unknown)}; choose from {list(CONDITIONS)}")
    mark_start()
    rows = measure(args)
    columns = ["condition", "rule", "steps_per_s", "weight_MB", "weight_fetches", "probe_MB",
               "weight_MB_per_s", "versions", "lag_updates_mean", "wall_s"]  # fmt: skip
    print(table(rows, columns))
    write_results("hosts", {"hosts": args.hosts, "total_steps": args.total_steps, "rows": rows},
                  args.out)  # fmt: skip
    plot(rows, args.plot)
    print(f"\nresults: {args.out}\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
