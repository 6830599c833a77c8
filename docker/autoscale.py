"""The plain-compose alternative to KEDA (docker/autoscaling/keda-scaledobject.yaml): scale the
compose `worker` service on the learner's queue depth.

    python docker/autoscale.py --metrics-url http://127.0.0.1:9100/metrics

Every --every-s seconds it reads `clusterenv_chunks_per_worker` (chunks in flight, running or
queued, per live worker process) from the learner's Prometheus endpoint and asks for
ceil(replicas x chunks per worker / --target) worker containers, within --min and --max: the HPA's
rule, which KEDA applies too. It needs Python with prometheus_client (the learner and worker
installs have it) and the `docker compose` client on the machine that runs compose.yaml.
"""

from __future__ import annotations

import argparse
import math
import shlex
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

PER_WORKER = "clusterenv_chunks_per_worker"
LIVE = "clusterenv_live_workers"


def desired_workers(replicas: int, per_worker: float, target: float, lo: int, hi: int) -> int:
    """Worker containers for `replicas` now carrying `per_worker` chunks per process, within
    [lo, hi]. No replica or no live process yet: the demand is unknown, keep what runs."""
    if replicas <= 0 or per_worker <= 0:
        return max(lo, min(hi, replicas))
    return max(lo, min(hi, math.ceil(replicas * per_worker / target - 1e-9)))


def read_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


def running_replicas(compose: list[str]) -> int:
    out = subprocess.run([*compose, "ps", "--quiet", "worker"], capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    return len(out.stdout.split())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--metrics-url",
        default="http://127.0.0.1:9100/metrics",
        help="the learner's --metrics-port endpoint (default: %(default)s)",
    )
    parser.add_argument("--target", type=float, default=1.5,
                        help="chunks in flight per worker process to aim for; the dispatcher keeps "
                             "--tasks-per-process (2) while the workers are the bottleneck "
                             "(default: %(default)s)")  # fmt: skip
    parser.add_argument("--min", type=int, default=1, help="fewest workers (default: %(default)s)")
    parser.add_argument("--max", type=int, default=8, help="most workers (default: %(default)s)")
    parser.add_argument(
        "--every-s", type=float, default=30.0, help="seconds between looks (default: %(default)s)"
    )
    parser.add_argument(
        "--compose",
        default="docker compose -f docker/compose.yaml",
        help="the compose command (default: %(default)s)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        help="the workers running now, instead of asking compose (with --dry-run)",
    )
    parser.add_argument("--once", action="store_true", help="one look, then exit")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the scale command instead of running it"
    )
    args = parser.parse_args(argv)
    if not args.target > 0 or not 1 <= args.min <= args.max:
        parser.error("need --target > 0 and 1 <= --min <= --max")
    compose = shlex.split(args.compose)
    while True:
        try:
            figures = read_metrics(args.metrics_url)
        except OSError as exc:  # the learner is between runs or restarting: look again later
            print(f"autoscale: cannot read {args.metrics_url}: {exc}", file=sys.stderr)
            figures = {}
        if PER_WORKER in figures:
            replicas = args.replicas if args.replicas is not None else running_replicas(compose)
            per_worker = figures[PER_WORKER] if figures.get(LIVE, 0) > 0 else 0.0
            want = desired_workers(replicas, per_worker, args.target, args.min, args.max)
            print(f"autoscale: {replicas} workers, {per_worker:.2f} chunks per process -> {want}",
                  file=sys.stderr, flush=True)  # fmt: skip
            if want != replicas:
                command = [*compose, "up", "--detach", "--no-recreate", "--scale",
                           f"worker={want}", "worker"]  # fmt: skip
                if args.dry_run:
                    print(shlex.join(command), flush=True)
                else:
                    subprocess.run(command, check=True, timeout=600)
        if args.once:
            return 0
        time.sleep(args.every_s)


if __name__ == "__main__":
    sys.exit(main())
