"""Redis as operators run it, started by the tests on free loopback ports: TLS with an ACL user (certificates
made here with openssl), a 3-node Redis Cluster, a master watched by a Sentinel. Never the shared 6379."""

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

ACL_USER, ACL_PASSWORD = "gw", "s3cret-pw"


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certificates(directory: Path) -> Certificates:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate (EC keys: fast)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=llmgw-test-ca"
    )
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    d = directory
    return Certificates(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")


def free_port(bus_too: bool = False) -> int:
    """A free loopback port (and port + 10000, a cluster node's bus, when asked)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if not bus_too or port + 10000 > 65535:
            if not bus_too:
                return port
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


class Server:
    def __init__(self, port: int, args: list[str], workdir: Path, client: dict[str, object]) -> None:
        self.port = port
        command = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--daemonize", "no", "--dir", str(workdir), *args]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._client = client
        deadline = time.monotonic() + 20
        while True:
            try:
                with self.client() as c:
                    c.ping()
                return
            except (redis.ConnectionError, redis.AuthenticationError, OSError):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.02)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5.0, **self._client)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


@contextmanager
def tls_acl_redis(workdir: Path, certs: Certificates, client_certs: bool = False) -> Iterator[Server]:
    """TLS only (no plain port); the default user off, `gw` allowed everything, `norights` only PING."""
    port = free_port()
    args = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(certs.server_cert),
            "--tls-key-file", str(certs.server_key), "--tls-ca-cert-file", str(certs.ca),
            "--tls-auth-clients", "yes" if client_certs else "no",
            "--user", "default", "off", "--user", ACL_USER, "on", f">{ACL_PASSWORD}", "~*", "&*", "+@all",
            "--user", "norights", "on", f">{ACL_PASSWORD}", "~*", "+ping", "+auth", "+hello"]  # fmt: skip
    tls = {"ssl": True, "ssl_ca_certs": str(certs.ca), "username": ACL_USER, "password": ACL_PASSWORD}
    if client_certs:
        tls |= {"ssl_certfile": str(certs.client_cert), "ssl_keyfile": str(certs.client_key)}
    server = Server(port, args, workdir, tls)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def redis_cluster(workdir: Path, nodes: int = 3) -> Iterator[list[Server]]:
    """A Redis Cluster of `nodes` masters (no replicas), every slot covered, state ok."""
    servers: list[Server] = []
    try:
        for _ in range(nodes):
            port = free_port(bus_too=True)
            args = ["--port", str(port), "--cluster-enabled", "yes", "--cluster-config-file",
                    str(workdir / f"nodes-{port}.conf"), "--cluster-node-timeout", "2000"]  # fmt: skip
            servers.append(Server(port, args, workdir, {}))
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in servers),
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)  # fmt: skip
        deadline = time.monotonic() + 20
        while not all(_cluster_ok(s) for s in servers):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not reach state ok")
            time.sleep(0.05)
        yield servers
    finally:
        for server in servers:
            server.stop()


def _cluster_ok(server: Server) -> bool:
    with server.client() as client:
        return "cluster_state:ok" in client.execute_command("CLUSTER", "INFO").decode()


@contextmanager
def sentinel_redis(workdir: Path) -> Iterator[tuple[Server, Server, Server]]:
    """A master, its replica and one Sentinel (quorum 1) watching them as `mymaster`."""
    master_port = free_port()
    master = Server(master_port, ["--port", str(master_port)], workdir, {})
    replica_port = free_port()
    replica = Server(replica_port, ["--port", str(replica_port), "--replicaof", "127.0.0.1", str(master.port)],
                     workdir, {})  # fmt: skip
    port = free_port()
    config = workdir / f"sentinel-{port}.conf"
    config.write_text(f"port {port}\nbind 127.0.0.1\nsentinel monitor mymaster 127.0.0.1 {master.port} 1\n"
                      "sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n")  # fmt: skip
    sentinel = subprocess.Popen(["redis-server", str(config), "--sentinel"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with redis.Redis(port=port, socket_timeout=2, decode_responses=True) as client:
                    replicas = client.execute_command("SENTINEL", "REPLICAS", "mymaster")
                    if any(_flags(r) == "slave" for r in replicas):
                        break  # it knows the replica it may promote
            except (redis.ConnectionError, redis.ResponseError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the Sentinel did not start")
            time.sleep(0.05)
        yield master, replica, _SentinelHandle(port, sentinel)  # type: ignore[misc]
    finally:
        sentinel.kill()
        sentinel.wait(timeout=10)
        replica.stop()
        master.stop()


class _SentinelHandle:
    def __init__(self, port: int, process: subprocess.Popen) -> None:
        self.port = port
        self.process = process

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5.0)


def _flags(replica: object) -> object:
    """A replica's flags from SENTINEL REPLICAS (redis-py parses it into a dict, or leaves a flat list)."""
    if isinstance(replica, dict):
        return replica.get("flags") if isinstance(replica.get("flags"), str) else ",".join(sorted(replica))
    items = list(replica)  # type: ignore[call-overload]
    return dict(zip(items[::2], items[1::2], strict=True)).get("flags")
