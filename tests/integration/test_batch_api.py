"""A batch of 200 chat requests (5 malformed) on two real workers, one SIGKILLed mid-batch:
195 results and 5 error lines, each ``custom_id`` once, every answer its job's final text.

The killed worker's loop is held (MINISERVE_TEST_LOOP_HOLD above its concurrency: a gate) so
the jobs it took are still running when the kill comes, however fast or busy the machine."""
from __future__ import annotations

import json
from collections import Counter

import requests

from core.batches import BatchStore
from tests.harness.stack import wait_until
from tests.integration.conftest import started_workers_and_web

PROMPTS = ["Name a fruit.", "Name a colour.", "Name a city.", "Name a tool.", "Name a river."]
MAX_TOKENS = 24
B2_CONCURRENCY = 8
HELD = {"MINISERVE_TEST_LOOP_HOLD": str(B2_CONCURRENCY + 1), "MINISERVE_TEST_LOOP_HOLD_S": "600"}
MALFORMED = {17: "not json at all", 60: "refused", 99: "duplicate", 140: "url", 180: "no-id"}


def lines() -> list[str]:
    out = []
    for i in range(200):
        body = {"messages": [{"role": "user", "content": PROMPTS[i % 5]}], "max_tokens": MAX_TOKENS}
        line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        kind = MALFORMED.get(i)
        if kind == "refused":
            body["store"] = True
        elif kind == "duplicate":
            line["custom_id"] = "r3"
        elif kind == "url":
            line["url"] = "/v1/embeddings"
        elif kind == "no-id":
            del line["custom_id"]
        out.append("{oops" if kind == "not json at all" else json.dumps(line))
    return out


def test_two_hundred_lines_on_two_workers_survive_a_sigkill(stack, store):
    workers, web, base = started_workers_and_web(stack, store, {"name": "b1", "pool": "threads", "concurrency": 8},
                                                 {"name": "b2", "pool": "threads", "concurrency": B2_CONCURRENCY, **HELD})
    try:
        file_id = requests.post(f"{base}/v1/files", data={"purpose": "batch"},
                                files={"file": ("in.jsonl", "\n".join(lines()).encode())}, timeout=30).json()["id"]
        batch = requests.post(f"{base}/v1/batches", json={"input_file_id": file_id, "completion_window": "24h",
                                                          "endpoint": "/v1/chat/completions"}, timeout=120).json()
        assert batch["status"] == "validating", batch  # the lines are read after the answer

        def progress() -> dict:
            return requests.get(f"{base}/v1/batches/{batch['id']}", timeout=30).json()

        wait_until(lambda: progress()["status"] != "validating", 60, interval_s=0.1, what="the batch's intake")
        assert progress()["request_counts"]["total"] == 200 and progress()["request_counts"]["failed"] >= 5

        wait_until(lambda: progress()["request_counts"]["completed"] >= 30, 120, interval_s=0.5,
                   what="30 results before the kill")

        def b2_jobs() -> int:  # its loop is held: the jobs it took stay running until the kill
            return sum(job.worker.startswith("b2@") for job in store.list(state="running", limit=200))

        wait_until(lambda: b2_jobs() == B2_CONCURRENCY, 120, interval_s=0.05, what="worker b2 holding its jobs")
        held = {job.id for job in store.list(state="running", limit=200) if job.worker.startswith("b2@")}
        workers[1].kill()  # SIGKILL, main process and pool
        wait_until(lambda: progress()["status"] == "completed", 180, interval_s=1, what="the batch to complete")
        done = progress()
        assert done["request_counts"] == {"total": 200, "completed": 195, "failed": 5}
        output = [json.loads(x) for x in requests.get(f"{base}/v1/files/{done['output_file_id']}/content",
                                                      timeout=30).text.splitlines()]
        errors = [json.loads(x) for x in requests.get(f"{base}/v1/files/{done['error_file_id']}/content",
                                                      timeout=30).text.splitlines()]
    finally:
        web.kill()  # teardown: no graceful stop is under test here
        for proc in workers:
            proc.kill()
    wanted = [f"r{i}" for i in range(200) if i not in MALFORMED]
    assert [o["custom_id"] for o in output] == wanted  # each once, in the input's order
    assert Counter(e["custom_id"] for e in errors) == Counter(["r3", "r60", "r140", None, None])
    texts: dict[str, set[str]] = {}
    for item in output:
        job = store.get(item["response"]["request_id"])
        message = item["response"]["body"]["choices"][0]["message"]["content"]
        assert job.state == "succeeded" and message == job.result["text"]
        texts.setdefault(PROMPTS[int(item["custom_id"][1:]) % 5], set()).add(message)
    assert all(len(answers) == 1 for answers in texts.values()), texts  # greedy fp32: one answer per prompt
    rerun = {o["response"]["request_id"] for o in output if store.get(o["response"]["request_id"]).attempt > 1}
    assert BatchStore(store.client).get_batch(done["id"]).status == "completed"
    assert held and held <= rerun, (held, rerun)  # each job b2 held at the kill ran again
