"""docker-compose.yml can scale workers (``docker compose up --scale worker=N``) and stays valid."""
import shutil
import subprocess

import pytest
import yaml

from bench.stack import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"


def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_worker_service_can_be_scaled():
    worker = services()["worker"]
    assert "container_name" not in worker and "ports" not in worker  # both would clash between replicas
    command = worker["command"]
    assert command[command.index("-n") + 1].endswith("@%h")  # one Celery node (and routing queue) per replica
    assert "-E" in command


def test_every_service_shares_one_redis():
    urls = {name: (svc.get("environment") or {}).get("MINISERVE_REDIS_URL")
            for name, svc in services().items() if name in ("worker", "web", "flower", "prepare-model")}
    assert len(set(urls.values())) == 1, urls


@pytest.mark.skipif(not shutil.which("docker-compose"), reason="docker-compose is not installed here")
def test_docker_compose_config_accepts_it():
    result = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
