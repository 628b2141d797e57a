"""A local Redis Sentinel set-up from real processes: one master, one replica, three sentinels.

Used by the failover test (tests/scale) and usable by hand (``python -m tests.harness.sentinel``
prints the URL and waits). Timeouts are short (down after 1 s) so a failover completes in
a few seconds; production values are in docs/deployment.md.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.harness.stack import Process, free_port, spawn, start_redis, wait_until

MASTER_NAME = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000
# A sentinel whose timer stalls for 2 s (a busy test machine) enters "tilt" and does nothing
# for 30 s; a master killed meanwhile is marked down only then, and the replica, disconnected
# longer than 10 x DOWN_AFTER_MS by that time, is never judged good enough to promote. These
# (Redis 7's SENTINEL DEBUG) keep a stall from tilting the sentinels and make a tilt short.
SENTINEL_DEBUG = {"tilt-trigger": 30000, "tilt-period": 1000}


def _binary() -> str:
    return shutil.which("redis-server") or "/usr/bin/redis-server"


@dataclass
class SentinelCluster:
    """Start with :meth:`start`; ``url`` is what MINISERVE_REDIS_URL gets."""

    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="miniserve-sentinel-")))
    master: Process | None = None
    replica: Process | None = None
    master_port: int = 0
    replica_port: int = 0
    sentinels: list[tuple[Process, int]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}" for _, port in self.sentinels) + "/0"

    def start(self) -> "SentinelCluster":
        master_dir, replica_dir = self.log_dir / "master", self.log_dir / "replica"
        master_dir.mkdir(exist_ok=True)
        replica_dir.mkdir(exist_ok=True)
        self.master, url = start_redis(master_dir)
        self.master_port = int(url.rsplit(":", 1)[1].split("/")[0])
        self.replica_port = free_port()
        self.replica = spawn(f"replica-{self.replica_port}", [
            _binary(), "--port", str(self.replica_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(replica_dir), "--replicaof", "127.0.0.1", str(self.master_port)], {}, self.log_dir)
        wait_until(lambda: self._replica_linked(), 15, what="replica in sync")
        for _ in range(3):
            self.sentinels.append(self._start_sentinel())
        wait_until(self._sentinels_tuned, 15, what="sentinels to answer")
        wait_until(self._sentinels_agree, 30, what="sentinels to see the replica and each other")
        return self

    def _start_sentinel(self) -> tuple[Process, int]:
        port = free_port()
        conf = self.log_dir / f"sentinel-{port}.conf"
        conf.write_text("\n".join([
            f"port {port}", "bind 127.0.0.1", f"dir {self.log_dir}",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master_port} 2",
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {MASTER_NAME} 1", ""]))
        return spawn(f"sentinel-{port}", [_binary(), str(conf), "--sentinel"], {}, self.log_dir), port

    def _sentinels_tuned(self) -> bool:
        """Apply SENTINEL_DEBUG to every sentinel (True once all answered; an older Redis without
        SENTINEL DEBUG keeps its defaults)."""
        try:
            for _, port in self.sentinels:
                client = redis.Redis(port=port, socket_timeout=1)
                for name, value in SENTINEL_DEBUG.items():
                    try:
                        client.execute_command("SENTINEL", "DEBUG", name, value)
                    except redis.ResponseError:
                        return True
        except redis.RedisError:
            return False
        return True

    def _replica_linked(self) -> bool:
        try:
            info = redis.Redis(port=self.replica_port, socket_timeout=1).info("replication")
        except redis.RedisError:
            return False
        return info.get("master_link_status") == "up"

    def _sentinels_agree(self) -> bool:
        try:
            for _, port in self.sentinels:
                client = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
                if len(client.sentinel_slaves(MASTER_NAME)) < 1 or len(client.sentinel_sentinels(MASTER_NAME)) < 2:
                    return False
        except redis.RedisError:
            return False
        return True

    def master_port_now(self) -> int:
        """The port the sentinels currently name as master."""
        _, port = self.sentinels[0]
        host_port = redis.Redis(port=port, socket_timeout=1).sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(host_port[1])

    def kill_master(self) -> None:
        """SIGKILL the master (no shutdown, no last save): the failure sentinels exist for."""
        if self.master is not None:
            self.master.kill()

    def wait_promoted(self, timeout_s: float = 30) -> float:
        """Wait until the sentinels name the replica as master; returns the seconds it took."""
        started = time.monotonic()
        wait_until(lambda: self._promoted(), timeout_s, interval_s=0.1, what="replica promoted")
        return time.monotonic() - started

    def _promoted(self) -> bool:
        try:
            if self.master_port_now() != self.replica_port:
                return False
            return redis.Redis(port=self.replica_port, socket_timeout=1).info("replication")["role"] == "master"
        except redis.RedisError:
            return False

    def stop(self) -> None:
        for proc, _ in self.sentinels:
            proc.kill()
        for proc in (self.replica, self.master):
            if proc is not None:
                proc.kill()


if __name__ == "__main__":
    cluster = SentinelCluster().start()
    print(f"MINISERVE_REDIS_URL='{cluster.url}' MINISERVE_REDIS_SENTINEL_MASTER={MASTER_NAME}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        cluster.stop()
