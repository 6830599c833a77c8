"""Faults across hosts on the network-namespace rig: workers SIGKILLed mid-chunk, a worker host cut
off for 30 s, the broker restarted, each during a real `clusterenv train` run.

The evidence is independent of the learner's own bookkeeping where it can be: every worker logs
each chunk it wrote to the stream (Celery's "succeeded" line, with the chunk id and its
transitions); the learner's summary.json lists the chunk ids that reached replay. A chunk is
**lost** if a worker wrote it while the learner was still reading and it never reached replay; a
transition is **duplicated** if a chunk is counted twice (ids accepted vs chunks and env steps
counted). Each test prints its figures (run pytest with -s); docs/reliability.md quotes them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from bench.netrig import Host, NetRig
from tests.worker_log import RECEIVED, SUCCEEDED

CHUNK_ENV_STEPS = 8 * 16


def learner_args(rig: NetRig, total_steps: int, lost_after_s: float) -> list[str]:
    # SlowEval sleeps 4 ms a step: a chunk (8 envs x 16 steps) takes about half a second of
    # sleep, so collection is paced by the envs, not by the CPU, and a kill lands mid-chunk.
    env_kwargs = {"log_path": str(rig.root / "evals.txt"), "delay_s": 0.004, "eval_delay_s": 0.0}
    return [sys.executable, "-m", "clusterenv.learner.tools.cli", "train", "--redis-url", rig.broker_url,
            "--workers", "0", "--env", "tests.e2e.step_recorder:SlowEval-v0",
            "--env-kwargs", json.dumps(env_kwargs), "--envs-per-worker", "8", "--chunk-steps", "16",
            "--samples-per-insert", "2", "--learning-starts", "256", "--hidden", "64,64",
            "--eval-every", "1000000", "--eval-episodes", "2", "--target-return", "1e9",
            "--lost-after-s", str(lost_after_s), "--status-every-s", "5",
            "--total-steps", str(total_steps), "--run-dir", str(rig.root / "runs")]  # fmt: skip


@dataclass
class Write:
    t: float  # wall clock, from the worker's log
    chunk: int
    log: str


def writes(rig: NetRig, pattern: str = "w*.log") -> list[Write]:
    """Every chunk the rig's workers wrote to the stream, in time order."""
    found = []
    for log in rig.root.glob(pattern):
        for m in SUCCEEDED.finditer(log.read_text(errors="replace")):
            t = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            task = json.loads(m[2])
            first = task["chunk"]
            found += [Write(t, c, log.name) for c in range(first, first + task["chunks_done"])]
    return sorted(found, key=lambda w: w.t)


def mid_chunk(log: Path) -> bool:
    """The worker writing `log` has taken a chunk and not finished it (a solo pool runs one)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    done = len(SUCCEEDED.findall(text))
    return done >= 1 and len(RECEIVED.findall(text)) > done


@dataclass
class Figures:
    """What a fault cost, from the workers' logs and the learner's summary."""

    summary: dict
    written: list[Write]
    ended_at: float
    lost: list[int] = field(default_factory=list)
    extra_copies: int = 0  # chunks written more than once while the learner read
    longest_stall_s: float = 0.0

    @classmethod
    def of(cls, rig: NetRig, run_dir: Path, exempt: tuple[float, float] | None = None) -> Figures:
        """`exempt`: a time window whose unread chunks the broker may lose (its restart)."""
        summary = json.loads((run_dir / "summary.json").read_text())
        # The reader stopped just before summary.json was written; allow it 2 s to have polled.
        ended_at = (run_dir / "summary.json").stat().st_mtime - 2.0
        fig = cls(summary, writes(rig), ended_at)
        accepted = fig.accepted()
        during = [w for w in fig.written if w.t < ended_at]
        lo, hi = exempt or (0.0, 0.0)
        fig.lost = sorted(
            {w.chunk for w in during if w.chunk not in accepted and not lo <= w.t <= hi}
        )
        ids = [w.chunk for w in during]
        fig.extra_copies = len(ids) - len(set(ids))
        times = [w.t for w in during if w.chunk in accepted]
        fig.longest_stall_s = max(
            (b - a for a, b in zip(times, times[1:], strict=False)), default=0.0
        )
        return fig

    def accepted(self) -> set[int]:
        return {i for a, b in self.summary["accepted_chunk_ids"] for i in range(a, b + 1)}

    def duplicated_transitions(self) -> int:
        """Env steps counted beyond one count per accepted chunk id (0 when none twice)."""
        ingest = self.summary["ingest"]
        assert len(self.accepted()) == ingest["chunks"]
        return self.summary["env_steps"] - ingest["chunks"] * CHUNK_ENV_STEPS

    def report(self, name: str, **extra: float) -> dict:
        s = self.summary
        row = {
            "chunks_accepted": s["ingest"]["chunks"], "lost": len(self.lost),
            "duplicated_transitions": self.duplicated_transitions(),
            "duplicates_dropped": s["ingest"]["duplicates"], "written_off": s["lost_chunks"],
            "late": s["late_chunks"], "longest_stall_s": round(self.longest_stall_s, 2), **extra,
        }  # fmt: skip
        print(f"\n{name}: {json.dumps(row)}")
        return row


def start_learner(rig: NetRig, args: list[str]) -> subprocess.Popen:
    return rig.popen(rig.learner, args, log=rig.root / "learner.log")


def wait_for(what: str, check, proc: subprocess.Popen, rig: NetRig, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None:
            pytest.fail(f"learner exited ({proc.returncode}) before {what}: {learner_log(rig)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f} s: {learner_log(rig)}")
        time.sleep(0.05)


def learner_log(rig: NetRig) -> str:
    log = rig.root / "learner.log"
    return log.read_text(errors="replace")[-6000:] if log.exists() else ""


def finish(proc: subprocess.Popen, rig: NetRig, timeout_s: float = 240) -> str:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # the learner prints every thread's stack: where it hangs
        time.sleep(2)
        pytest.fail(f"the run did not end in {timeout_s} s: {learner_log(rig)}")
    return learner_log(rig)


def run_dir_of(rig: NetRig) -> Path:
    (run_dir,) = [p for p in (rig.root / "runs").iterdir() if p.is_dir()]
    return run_dir


def served_by(rig: NetRig, host: Host, after: float) -> list[Write]:
    return [w for w in writes(rig, f"{host.role}-*.log") if w.t > after]


@pytest.mark.slow
def test_ten_workers_killed_mid_chunk_lose_and_duplicate_nothing(net_rig):
    rig = net_rig(workers=2)
    pools = {host.role: rig.workers(host, 1) for host in rig.hosts}
    proc = start_learner(rig, learner_args(rig, total_steps=30_000, lost_after_s=5.0))
    started = time.time()
    kills: list[tuple[float, str]] = []  # (when, host role)
    deadline = time.monotonic() + 180
    while len(kills) < 10:
        assert proc.poll() is None, f"the run ended after {len(kills)} kills: {learner_log(rig)}"
        assert time.monotonic() < deadline, f"only {len(kills)} kills in 180 s"
        for host in rig.hosts:
            pool = pools[host.role]
            if (not kills or time.time() - kills[-1][0] > 1.0) and mid_chunk(pool.log_path):
                os.killpg(pool.procs[-1].pid, signal.SIGKILL)
                kills.append((time.time(), host.role))
                assert mid_chunk(pool.log_path)  # still mid-chunk when it died
                pools[host.role] = rig.workers(host, 1)  # a replacement
        time.sleep(0.05)
    out = finish(proc, rig)
    assert proc.returncode == 0, out
    fig = Figures.of(rig, run_dir_of(rig))
    recovered = []
    for t, role in kills:  # the first chunk its host wrote again
        after = [w.t for w in served_by(rig, next(h for h in rig.hosts if h.role == role), t)]
        recovered.append(min(after) - t if after else float("inf"))
    fig.report("10 SIGKILLs", kills=len(kills), recover_s_max=round(max(recovered), 2),
               recover_s_median=round(sorted(recovered)[len(recovered) // 2], 2),
               kills_done_after_s=round(kills[-1][0] - started, 1),
               run_wall_s=fig.summary["wall_s"])  # fmt: skip
    assert fig.lost == [] and fig.duplicated_transitions() == 0
    assert fig.summary["env_steps"] >= 30_000 and fig.summary["ingest"]["rejected"] == 0
    assert fig.summary["ingest"]["duplicates"] >= fig.extra_copies  # every extra copy dropped
    assert max(recovered) < 60


@pytest.mark.slow
def test_a_host_cut_off_for_30_s_is_replaced_then_serves_again(net_rig):
    rig = net_rig(workers=2, one_way_ms=1.0)  # 2 ms round trip, as within a cloud zone
    pools = [rig.workers(host, 1) for host in rig.hosts]
    cut = rig.hosts[1]
    proc = start_learner(rig, learner_args(rig, total_steps=10_000_000, lost_after_s=5.0))

    def holds_a_chunk() -> bool:  # so the cut strands one: between tasks it would hold none
        return len(served_by(rig, cut, 0)) >= 3 and mid_chunk(pools[1].log_path)

    wait_for("the host to cut off serving a chunk", holds_a_chunk, proc, rig, 120)
    cut_at = time.time()
    rig.link(cut, up=False)
    time.sleep(30)
    rig.link(cut, up=True)
    up_at = time.time()
    before_up = max(w.chunk for w in writes(rig) if w.t < up_at)

    def serves_new_chunks() -> bool:  # a chunk dispatched after the link came back
        return any(w.chunk > before_up for w in served_by(rig, cut, up_at))

    wait_for("new chunk from the host that was cut off", serves_new_chunks, proc, rig, 120)
    back = min(w.t for w in served_by(rig, cut, up_at) if w.chunk > before_up)
    time.sleep(2)  # the learner reads what was written up to now
    proc.send_signal(signal.SIGINT)
    out = finish(proc, rig, 60)
    assert proc.returncode == 130, out
    fig = Figures.of(rig, run_dir_of(rig))
    others = [w for w in writes(rig, "w0-*.log") if cut_at + 5 + 2 < w.t < up_at]
    fig.report("host cut off 30 s", recover_s=round(back - up_at, 2),
               chunks_from_others_while_cut=len(others))  # fmt: skip
    assert fig.summary["lost_chunks"] >= 1  # what it held was written off and re-dispatched
    assert len(others) >= 10  # and the other host kept collecting meanwhile
    assert fig.lost == [] and fig.duplicated_transitions() == 0
    assert fig.summary["ingest"]["duplicates"] >= fig.extra_copies  # late copies dropped


@pytest.mark.slow
def test_a_broker_restart_on_the_rig_is_survived(net_rig):
    rig = net_rig(workers=2, one_way_ms=5.0)  # 10 ms round trip
    for host in rig.hosts:
        rig.workers(host, 1)
    proc = start_learner(rig, learner_args(rig, total_steps=12_000, lost_after_s=30.0))
    wait_for("20 chunks", lambda: len(writes(rig)) >= 20, proc, rig, 120)
    stopped_at = time.time()
    rig.stop_broker()
    time.sleep(3.0)
    rig.start_broker()
    back_at = time.time()
    out = finish(proc, rig)
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    fig = Figures.of(rig, run_dir_of(rig), exempt=(stopped_at - 1.0, back_at))
    after = [w.t for w in writes(rig) if w.t > back_at]
    lost_with_broker = {w.chunk for w in writes(rig) if stopped_at - 1.0 <= w.t <= back_at}
    fig.report("broker restart", recover_s=round(min(after) - back_at, 2),
               lost_with_the_broker=len(lost_with_broker - fig.accepted()),
               broker_recoveries=fig.summary["broker_recoveries"])  # fmt: skip
    assert fig.summary["broker_recoveries"] >= 1
    assert fig.summary["env_steps"] >= 12_000 and fig.summary["ingest"]["rejected"] == 0
    assert fig.lost == [] and fig.duplicated_transitions() == 0
    hosts_after = {w.log.split("-")[0] for w in writes(rig) if w.t > back_at}
    assert hosts_after == {"w0", "w1"}  # both hosts' workers reconnected and served
