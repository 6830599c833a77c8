"""The network-namespace rig itself: isolated hosts, the proxy's delay, the tbf cap, a cut link."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from bench.netrig import PROXY_PORT, NetRig

# Run inside a host namespace: times PINGs and one SET of a 1 MB value through the broker URL.
PROBE = """
import json, sys, time, redis
r = redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1, socket_timeout=5)
try:
    r.ping()
except redis.RedisError as exc:
    print(json.dumps({"error": str(exc)})); sys.exit()
rtts = []
for _ in range(10):
    t = time.perf_counter(); r.ping(); rtts.append(time.perf_counter() - t)
t = time.perf_counter(); r.set("probe", b"x" * 1_000_000); put = time.perf_counter() - t
print(json.dumps({"rtt_s": sorted(rtts)[5], "put_1mb_s": put}))
"""


def probe(rig: NetRig, host_index: int = 0) -> dict:
    proc = rig.popen(rig.hosts[host_index], [sys.executable, "-c", PROBE, rig.broker_url],
                     stdout=subprocess.PIPE)  # fmt: skip
    out, _ = proc.communicate(timeout=60)
    return json.loads(out.decode().strip().splitlines()[-1])


def namespaces() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def test_delay_cap_and_cut_link(net_rig):
    rig = net_rig(workers=2, one_way_ms=10.0)
    assert f"{rig.id}-w1" in namespaces() and rig.broker_url.endswith(f":{PROXY_PORT}/0")
    fast = probe(rig)
    assert 0.019 <= fast["rtt_s"] < 0.2, fast  # 2 x 10 ms one way
    rig.cap_broker(8.0)  # 8 Mbit/s: 1 MB takes about a second
    capped = probe(rig, 1)
    assert capped["put_1mb_s"] > 0.7 and capped["put_1mb_s"] > 3 * fast["put_1mb_s"], (fast, capped)
    rig.cap_broker(None)
    rig.link(rig.hosts[0], up=False)
    assert "error" in probe(rig, 0)  # cut off
    assert "rtt_s" in probe(rig, 1)  # the other host is not
    rig.link(rig.hosts[0], up=True)
    # The neighbour entry failed while the port was down: the first tries may find no route yet.
    deadline = time.monotonic() + 15
    while "rtt_s" not in (back := probe(rig, 0)):
        assert time.monotonic() < deadline, back
        time.sleep(0.5)


def host_links() -> str:
    """The interfaces and addresses of the namespace pytest runs in (the host's own)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    addrs = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    return links + addrs


def test_rigs_are_apart_and_leave_nothing(net_rig):
    before = host_links()
    a, b = net_rig(workers=1), net_rig(workers=1)
    assert host_links() == before  # no interface or address of the host was added or changed
    assert a.id != b.id
    server = a.redis_cli("info", "server")
    assert "redis_version" in server
    a.redis_cli("set", "only-in-a", "1")
    assert b.redis_cli("exists", "only-in-a") == "0"  # each rig has its own broker
    names = [a.switch, a.broker.ns, b.switch, b.learner.ns]
    assert set(names) <= set(namespaces())
    assert a.close() == [] and b.close() == []
    assert not set(names) & set(namespaces())
