"""docker-compose.yml can scale workers (``docker compose up --scale worker=N``) and stays valid."""
import shutil
import subprocess

import pytest
import yaml

from tests.harness.stack import REPO_ROOT

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
            for name, svc in services().items() if name in ("worker", "worker-qwen25", "web", "flower", "prepare-model")}
    assert len(set(urls.values())) == 1, urls


def test_two_worker_services_serve_two_models_on_their_own_queues():
    """The default model's workers take the shared queues; the second model's only its own
    (the worker adds generation.<id> and agent.<id> itself, worker/app.py)."""
    first, second = services()["worker"], services()["worker-qwen25"]
    models = [(svc.get("environment") or {}).get("MINISERVE_MODEL", "default") for svc in (first, second)]
    assert models[0] == "default" and models[1] not in ("", "default")
    queues = [svc["command"][svc["command"].index("-Q") + 1].split(",") for svc in (first, second)]
    assert "generation" in queues[0] and "agent" in queues[0] and not {"generation", "agent"} & set(queues[1])
    nodes = [svc["command"][svc["command"].index("-n") + 1] for svc in (first, second)]
    assert len(set(nodes)) == 2 and all(node.endswith("@%h") for node in nodes)


def docker_compose() -> str | None:
    """The checker `make test` installs (scripts/compose_tool.sh), else one on PATH."""
    local = REPO_ROOT / ".venv-compose" / "bin" / "docker-compose"
    return str(local) if local.exists() else shutil.which("docker-compose")


def compose_config(path) -> subprocess.CompletedProcess:
    return subprocess.run([docker_compose(), "-f", str(path), "config", "-q"], capture_output=True, text=True)


@pytest.mark.skipif(docker_compose() is None, reason="docker-compose is not installed (make compose-tool)")
def test_docker_compose_config_accepts_it():
    result = compose_config(COMPOSE)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(docker_compose() is None, reason="docker-compose is not installed (make compose-tool)")
def test_docker_compose_config_rejects_a_broken_file(tmp_path):
    """The checker is a real validator: an unknown service option fails it."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("services:\n", "services:\n  bogus:\n    imagex: 1\n", 1))
    result = compose_config(broken)
    assert result.returncode != 0 and "imagex" in result.stderr


def test_web_is_health_checked_with_readiness():
    """The web's check probes ``/health`` (a worker has its model), not ``/healthz`` (alive)."""
    check = services()["web"]["healthcheck"]
    probe = " ".join(check["test"])
    assert "/health'" in probe and "/healthz" not in probe
    assert check["start_period"].endswith("s")  # the first model load is not counted as failures
