"""A real redis-server of a test's own, on a private loopback port, that the test may stop and start
again (a broker restart), optionally with a password, ACL users and TLS (certificates made here by
the openssl CLI); and Flower, started as the docs say. Only servers started here are stopped here."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import redis

from clusterenv.pipeline.cluster.embedded import free_port


@dataclass(frozen=True)
class Certs:
    """A test CA, a server certificate for 127.0.0.1 signed by it, and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def query(self, client_cert: bool = True) -> str:
        """URL query options that redis-py and Celery's Redis transport both read."""
        opts = {"ssl_cert_reqs": "required", "ssl_ca_certs": str(self.ca)}
        if client_cert:
            opts |= {"ssl_certfile": str(self.client_cert), "ssl_keyfile": str(self.client_key)}
        return urlencode(opts)


def make_certs(folder: Path) -> Certs:
    """Short-lived RSA certificates in `folder`, made with the openssl CLI."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=clusterenv test CA", "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("client", "extendedKeyUsage=clientAuth")):  # fmt: skip
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=clusterenv {name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        (folder / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt")  # fmt: skip
    return Certs(*(folder / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")))  # fmt: skip


class PrivateRedis:
    """`redis-server` (Debian's binary) without persistence, so a restart loses everything.

    `password` sets requirepass (the default user's password); `acl` adds ACL SETUSER rules, one
    string per user ("name on >pass ~keys* +@all"); `certs` serves TLS only (no plain port) and,
    with `client_certs`, demands a client certificate. `url` is what clients use: it carries
    the password and, with TLS, the CA and client-certificate options."""

    def __init__(
        self,
        port: int | None = None,
        password: str | None = None,
        acl: tuple[str, ...] = (),
        certs: Certs | None = None,
        client_certs: bool = True,
    ):
        self.port = port or free_port()
        self.password, self.acl, self.certs, self.client_certs = password, acl, certs, client_certs
        self.url = self.url_for(password=password)
        self.proc: subprocess.Popen | None = None

    def url_for(self, user: str = "", password: str | None = None) -> str:
        """The URL of this server for `user` (the default user when empty) with `password`."""
        auth = f"{quote(user, safe='')}:{quote(password, safe='')}@" if password else ""
        if self.certs is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        return f"rediss://{auth}127.0.0.1:{self.port}/0?{self.certs.query(self.client_certs)}"

    def _args(self) -> list[str]:
        args = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        for rule in self.acl:
            args += ["--user", *rule.split()]
        if self.certs is None:
            return ["--port", str(self.port), *args]
        c = self.certs
        return ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(c.server_cert),
                "--tls-key-file", str(c.server_key), "--tls-ca-cert-file", str(c.ca),
                "--tls-auth-clients", "yes" if self.client_certs else "no", *args]  # fmt: skip

    def start(self, timeout_s: float = 10.0) -> str:
        self.proc = subprocess.Popen(
            ["redis-server", *self._args()],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=0.5) as probe:
                    probe.ping()
                return self.url
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # as abrupt as a crash; nothing is saved anyway
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, down_s: float) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def __enter__(self) -> PrivateRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()


def http_get(
    url: str, auth: tuple[str, str] | None = None, timeout_s: float = 5.0
) -> tuple[int, bytes]:
    """(status, body) of a GET, with HTTP basic auth when given; an HTTP error is a status too."""
    req = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(":".join(auth).encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


@contextlib.contextmanager
def flower(
    broker_url: str,
    *args: str,
    auth: tuple[str, str] | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> Iterator[str]:
    """`celery -A clusterenv.tasks flower` on a free loopback port for `broker_url` (more flags in `args`,
    more environment in `env`); yields its base URL once its API answers (with `auth`), and
    stops it afterwards."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "clusterenv.tasks", "flower", f"--port={port}",
         "--address=127.0.0.1", *args],
        env={**os.environ, "CLUSTERENV_REDIS_URL": broker_url, **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            assert proc.poll() is None, "flower exited"
            assert time.monotonic() < deadline, "flower did not come up"
            with contextlib.suppress(OSError):
                if http_get(f"{base}/api/workers", auth)[0] == 200:
                    break
            time.sleep(0.3)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
