"""A real redis-server and a real ``python -m web`` (gunicorn) for tests that need sockets."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import redis

ROOT = Path(__file__).resolve().parents[2]
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
HAVE_REDIS_SERVER = Path(REDIS_SERVER).exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check: Callable[[], object], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise TimeoutError("service did not come up")


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A throwaway redis-server; yields its URL."""
    port = free_port()
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_for(lambda: redis.Redis.from_url(url).ping())
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def web_server(redis_url: str, cache_dir: Path, log: Path, **env: str) -> Iterator[str]:
    """``python -m web`` with one gunicorn process on a free port; yields its base URL."""
    port = free_port()
    env = {**os.environ, "MINISERVE_REDIS_URL": redis_url, "MINISERVE_PORT": str(port),
           "MINISERVE_HOST": "127.0.0.1", "MINISERVE_CACHE_DIR": str(cache_dir),
           "MINISERVE_WEB_WORKERS": "1", "MINISERVE_SSE_KEEPALIVE_S": "1", "MINISERVE_API_KEYS": "", **env}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "web"], cwd=ROOT, env=env, stdout=out, stderr=out)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: urllib.request.urlopen(f"{base}/healthz", timeout=1).status == 200)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=15)
