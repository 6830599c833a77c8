"""A multi-host rig on one machine: broker, learner and worker hosts in network namespaces.

Each role gets a namespace of its own (`<rig id>-broker`, `-learner`, `-w0`, `-w1`, ...), joined
by veth pairs to a bridge that lives in one more namespace (`<rig id>-sw`), so the rig's subnet
exists only inside those namespaces: no interface, route or address of the host is created or
touched, and nothing the rig runs can reach beyond its own namespaces. The rig id carries the pid
and a random part, so two rigs never share a name.

- Broker: Debian's `redis-server` (no persistence) on the broker namespace's loopback, reached
  through a delaying TCP proxy on the broker's address (`broker_url`); netem is missing from this
  kernel, so latency is added there: each byte is forwarded `one_way_ms` after it arrived, in each
  direction (round trip = 2 x one_way_ms), without limiting throughput.
- Bandwidth: `cap_broker(mbit)` puts a `tc tbf` qdisc on both ends of the broker's link.
- Partitions: `link(host, up=False)` takes a host's switch port down (TCP connections survive,
  packets are dropped, as when a VM loses its network).
- Processes: `popen(host, argv)` runs a command in a host's namespace (`ip netns exec`) in a
  process group of its own; `workers(host, n)` starts `celery worker`s there (LocalWorkers).
  `close()` kills every group it started and every process left in its namespaces, deletes the
  namespaces, and returns what it had to kill beyond its own groups (a test asserts it is empty).

Tests and benchmarks import it (`with NetRig(workers=4) as rig: ...`); the pytest fixture is
`net_rig` in tests/conftest.py. `python -m bench.netrig proxy ...` is the proxy process itself.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.signals import default_stop_signals
from clusterenv.pipeline.cluster.embedded import LocalWorkers, die_with_parent


def _child_setup() -> None:
    """preexec_fn: the child dies with this process and sees SIGINT as a terminal sends it (a test
    stops a learner with SIGINT even when pytest itself runs in the background)."""
    die_with_parent()
    default_stop_signals()


SUBNET = "10.231.7"  # a /24 that exists only on the rig's bridge
REDIS_PORT, PROXY_PORT = 6379, 6380
REPO_ROOT = Path(__file__).resolve().parent.parent


def unavailable() -> str | None:
    """Why a rig cannot be built here (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"ceprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _sh(*argv: str) -> None:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()}")


class Host:
    """One namespace on the rig's bridge: `role` (broker, learner, w0, ...), its address."""

    def __init__(self, rig_id: str, role: str, addr: str):
        self.role, self.addr = role, addr
        self.ns = f"{rig_id}-{role}"
        self.port = f"p-{role}"  # its end on the switch (interface names in the switch namespace)

    def exec(self) -> list[str]:
        """The launcher that runs a command inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns]


class NetRig:
    """Broker, learner and `workers` worker hosts on a private bridge; a context manager."""

    def __init__(self, workers: int = 2, one_way_ms: float = 0.0, root: Path | None = None):
        if not 1 <= workers <= 100:
            raise ValueError(f"a rig has 1..100 worker hosts, got {workers}")
        self.id = f"ce{os.getpid() % 100000}{uuid.uuid4().hex[:4]}"
        self.root = Path(root) if root else Path(f"/tmp/{self.id}")
        self.switch = f"{self.id}-sw"
        self.broker = Host(self.id, "broker", f"{SUBNET}.1")
        self.learner = Host(self.id, "learner", f"{SUBNET}.2")
        self.hosts = [Host(self.id, f"w{i}", f"{SUBNET}.{10 + i}") for i in range(workers)]
        self.one_way_ms = one_way_ms
        self.broker_url = f"redis://{self.broker.addr}:{PROXY_PORT}/0"
        self._procs: list[subprocess.Popen] = []
        self._pools: list[LocalWorkers] = []
        self._redis: subprocess.Popen | None = None
        self._proxy: subprocess.Popen | None = None
        self._made: list[str] = []  # namespaces created, to delete in close()

    @property
    def all_hosts(self) -> list[Host]:
        return [self.broker, self.learner, *self.hosts]

    # --- build and tear down ---------------------------------------------------------------------
    def __enter__(self) -> NetRig:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def build(self) -> None:
        # Also on a KeyboardInterrupt that skips the caller's own clean-up: at exit, if not before.
        atexit.register(self.close)
        self.root.mkdir(parents=True, exist_ok=True)
        self._add_ns(self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for host in self.all_hosts:
            self._add_ns(host.ns)
            _sh("ip", "-n", self.switch, "link", "add", host.port, "type", "veth",
                "peer", "name", "eth0", "netns", host.ns)  # fmt: skip
            _sh("ip", "-n", self.switch, "link", "set", host.port, "master", "br0", "up")
            _sh("ip", "-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
            _sh("ip", "-n", host.ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", host.ns, "link", "set", "lo", "up")
        self.start_broker()
        self.set_delay(self.one_way_ms)

    def _add_ns(self, name: str) -> None:
        _sh("ip", "netns", "add", name)
        self._made.append(name)

    def close(self) -> list[str]:
        """Stop everything, delete the namespaces; returns processes that had to be killed
        beyond the groups the rig started itself (anything there is a leak)."""
        atexit.unregister(self.close)
        for pool in self._pools:
            with contextlib.suppress(Exception):
                pool.stop(timeout_s=5.0)
        for proc in self._procs:
            _kill_group(proc)
        leaks: list[str] = []
        for ns in self._made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                leaks.append(f"{ns}:{pid}")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)  # in our namespace, so ours
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        leaks += [f"namespace {ns}" for ns in self._made if ns in left.split()]
        self._made.clear()
        return leaks

    # --- processes -------------------------------------------------------------------------------
    def popen(
        self, host: Host, argv: list[str], log: Path | None = None, **kw: Any
    ) -> subprocess.Popen:
        """`argv` in `host`'s namespace, in its own process group, dying with this process."""
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
        try:
            proc = subprocess.Popen(
                [*host.exec(), *argv], stdout=kw.pop("stdout", out), stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_child_setup,
                cwd=REPO_ROOT, **kw,
            )  # fmt: skip
        finally:
            if log:
                out.close()
        self._procs.append(proc)
        return proc

    def workers(self, host: Host, count: int, env: dict[str, str] | None = None) -> LocalWorkers:
        """Start `count` celery workers on `host` (log: root/<role>-<tag>.log); `env` is added to
        theirs. Their `tag` is in every chunk header's worker name."""
        launcher = [*host.exec(), "env", *(f"{k}={v}" for k, v in (env or {}).items())]
        pool = LocalWorkers(self.broker_url, count, launcher=launcher)
        pool.log_path = self.root / f"{host.role}-{pool.tag}.log"
        pool.start()
        self._pools.append(pool)
        return pool

    def redis_cli(self, *args: str) -> str:
        """A command on the broker, from inside its namespace (not through the proxy)."""
        out = subprocess.run(
            [*self.broker.exec(), "redis-cli", "-p", str(REDIS_PORT), *args],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return out.stdout.strip()

    # --- the broker and the path to it -----------------------------------------------------------
    def start_broker(self, timeout_s: float = 10.0) -> None:
        self._redis = self.popen(
            self.broker,
            ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while self.redis_cli("ping") != "PONG":
            if self._redis.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server in {self.broker.ns} did not start")
            time.sleep(0.05)

    def stop_broker(self) -> None:
        """Kill the server as abruptly as a crash (it keeps nothing anyway)."""
        if self._redis is not None:
            _kill_group(self._redis)
            self._redis = None

    def set_delay(self, one_way_ms: float) -> None:
        """(Re)start the proxy with this one-way delay; open connections are cut."""
        if self._proxy is not None:
            _kill_group(self._proxy)
        self.one_way_ms = one_way_ms
        argv = [sys.executable, "-m", "bench.netrig", "proxy", self.broker.addr, str(PROXY_PORT),
                "127.0.0.1", str(REDIS_PORT), str(one_way_ms)]  # fmt: skip
        self._proxy = self.popen(self.broker, argv, stdout=subprocess.PIPE)
        assert self._proxy.stdout is not None
        line = self._proxy.stdout.readline()  # printed once it listens
        if b"listening" not in line:
            raise RuntimeError(f"delay proxy did not start: {line!r}")

    def cap_broker(self, mbit: float | None) -> None:
        """Cap the broker's link to `mbit` Mbit/s each way (tc tbf on both ends); None: uncap."""
        for ns, dev in ((self.broker.ns, "eth0"), (self.switch, self.broker.port)):
            if mbit is None:
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)  # fmt: skip
            else:
                _sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                    "rate", f"{mbit}mbit", "burst", "64kb", "latency", "200ms")  # fmt: skip

    def link(self, host: Host, up: bool) -> None:
        """Connect or cut `host` at the switch."""
        _sh("ip", "-n", self.switch, "link", "set", host.port, "up" if up else "down")


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


# --- the delaying proxy (runs inside the broker's namespace) ---------------------------------------
async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float):
    """Copy reader to writer, each piece sent `delay_s` after it arrived (pieces keep their order
    and do not wait for each other: latency, not a rate limit)."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await pieces.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(1 << 16):
            pieces.put_nowait((loop.time() + delay_s, data))
    except ConnectionError:
        pass
    pieces.put_nowait((loop.time() + delay_s, b""))
    with contextlib.suppress(ConnectionError):
        await sender
    writer.close()


async def _proxy(listen: str, port: int, up_host: str, up_port: int, delay_s: float) -> None:
    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(up_host, up_port)
        except OSError:  # the broker is down: refuse, as the broker itself would
            client_w.close()
            return
        await asyncio.gather(
            _forward(client_r, up_w, delay_s), _forward(up_r, client_w, delay_s),
            return_exceptions=True,
        )  # fmt: skip

    server = await asyncio.start_server(serve, listen, port)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__" and sys.argv[1:2] == ["proxy"]:
    host, port, up_host, up_port, delay_ms = sys.argv[2:7]
    asyncio.run(_proxy(host, int(port), up_host, int(up_port), float(delay_ms) / 1000))
