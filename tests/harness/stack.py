"""Start a real local stack (redis-server, Celery worker, web server) as subprocesses.

Used by the integration tests and by the benchmarks that measure the whole path, so both
exercise exactly the processes a user runs.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from core.jobs import JobStore
from core.redis_conn import client_for, parse_redis_url

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


@dataclass
class Process:
    """A child process with its log file; ``kill`` sends SIGKILL, ``stop`` SIGTERM then waits."""

    name: str
    popen: subprocess.Popen
    log_path: Path

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the main process only (as a service manager does), SIGKILL on timeout."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL to the whole process group (main process and pool children)."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def spawn(name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> Process:
    log_path = log_dir / f"{name}.log"
    handle = open(log_path, "ab")
    popen = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                             start_new_session=True)
    return Process(name, popen, log_path)


def start_redis(log_dir: Path, port: int | None = None, appendonly: bool = False) -> tuple[Process, str]:
    port = port or free_port()
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes" if appendonly else "no", "--dir", str(log_dir)]
    proc = spawn(f"redis-{port}", argv, dict(os.environ), log_dir)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    wait_until(lambda: _pings(client), 10, what="redis-server")
    return proc, url


def job_store(redis_url: str, master_name: str = "mymaster", ttl_s: int = 3600) -> JobStore:
    """A job store on ``redis_url`` (plain or ``sentinel://``), made the way web and worker make theirs."""
    return JobStore(client_for(parse_redis_url(redis_url, master_name), decode_responses=True), ttl_s=ttl_s)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@dataclass
class Stack:
    """Environment shared by the processes of one local stack."""

    redis_url: str
    env_overrides: dict[str, str] = field(default_factory=dict)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="miniserve-stack-")))

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINISERVE_")}
        env.update({"MINISERVE_REDIS_URL": self.redis_url, "PYTHONUNBUFFERED": "1"})
        env.update(self.env_overrides)
        env.update(extra)
        return env

    def start_worker(self, name: str = "w1", pool: str = "prefork", concurrency: int = 1,
                     queues: str = "generation,agent,bench", **env: str) -> Process:
        argv = [sys.executable, "-m", "celery", "-A", "worker", "worker", "-P", pool, "-c", str(concurrency),
                "-Q", queues, "-E", "-n", f"{name}@%h", "--loglevel", "INFO", "--without-mingle",
                "--without-gossip"]
        # Celery lets the app's worker_pool setting override an explicit "-P prefork" (the CLI
        # cannot tell it from its default), so the pool is also passed as our setting.
        env = {"MINISERVE_WORKER_POOL": pool, "MINISERVE_WORKER_CONCURRENCY": str(concurrency), **env}
        return spawn(f"worker-{name}", argv, self.env(**env), self.log_dir)

    def start_web(self, port: int | None = None, **env: str) -> tuple[Process, str]:
        port = port or free_port()
        proc = spawn(f"web-{port}", [sys.executable, "-m", "web"],
                     self.env(MINISERVE_PORT=str(port), MINISERVE_HOST="127.0.0.1", **env), self.log_dir)
        return proc, f"http://127.0.0.1:{port}"
