"""The agent evaluation through real Celery: a chord started by name, as from the celery CLI."""
from __future__ import annotations

import pytest
from celery import Celery

from worker.agent_eval_tasks import EVAL_CASE, EVAL_START

pytestmark = pytest.mark.integration


@pytest.fixture
def client(served_shared):
    app = Celery("agent-eval-test", broker=served_shared.stack.redis_url, backend=served_shared.stack.redis_url)
    yield app
    app.close()


def test_evaluation_chord_from_the_task_name(client, worker, tmp_path):
    output = tmp_path / "eval.csv"
    started = client.send_task(EVAL_START, queue="bench",
                               kwargs={"categories": ["tool_error"], "limit": 2, "output": str(output),
                                       "max_new_tokens": 8})
    chord_id = started.get(timeout=60)
    summary = client.AsyncResult(chord_id).get(timeout=180)
    assert summary["overall"]["cases"] == 2
    # The tiny random model writes no tool call; forced_calculator routes both cases.
    assert summary["overall"]["routing"] == 1.0 and summary["overall"]["tool_result"] == 1.0
    assert {p.rsplit(".", 1)[1] for p in summary["paths"].values()} == {"csv", "json", "png"}
    assert output.exists() and output.with_suffix(".png").stat().st_size > 0


def test_one_case_task_returns_its_record(client, worker):
    case = {"id": "t1", "category": "calculator", "lang": "en", "prompt": "Calculate 17 * 23",
            "expected_tool": "calculator", "tool_check": {"numbers": [391]}, "answer_check": {"numbers": [391]}}
    record = client.send_task(EVAL_CASE, args=[case, 2, 8], queue="agent").get(timeout=120)
    assert record["id"] == "t1" and record["tool"] == "calculator" and record["tool_ok"] is True
    assert record["trace"][0]["result"] == "391"
