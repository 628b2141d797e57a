"""``POST /v1/batches`` answers ``validating`` and a thread of the web reads the lines after
(web/openai/batch_intake.py): the answer comes before any line is queued, the lines are
appended chunk by chunk in order, a line over the body cap is refused by its size (never
parsed, never tokenized), and a batch whose intake stopped is failed by the next reader,
its queued jobs cancelled. The intake is held on an event, so every state is seen on
purpose, never by timing."""
from __future__ import annotations

import threading

import pytest

from core import keys
from core.batches import BatchStore
from core.events import CANCELLED
from tests.harness.stack import wait_until
from tests.web.test_openai_batch import intake_done, line, start
from web.openai import batch_intake, batch_lines
from web.prompt_budget import PromptBudget


class HeldIntake:
    """``submit_line`` that lets ``allowed`` lines through, then waits for ``release``."""

    def __init__(self, monkeypatch, allowed: int) -> None:
        self.allowed, self.calls, self.gate = allowed, 0, threading.Event()
        self.waiting = threading.Event()
        real = batch_intake.submit_line

        def held(*args, **kwargs):
            self.calls += 1
            if self.calls > self.allowed:
                self.waiting.set()
                assert self.gate.wait(30), "the test never released the intake"  # a safety net
            return real(*args, **kwargs)

        monkeypatch.setattr(batch_intake, "submit_line", held)

    def wait_held(self) -> None:
        assert self.waiting.wait(30), "the intake never reached the held line"


def lines(count: int) -> str:
    return "\n".join(line(f"r{i}") for i in range(count))


def job_ids(store: BatchStore, batch_id: str) -> list[str]:
    return [e["job_id"] for e in store.entries(batch_id) if "job_id" in e]


def test_the_post_answers_validating_before_any_line_is_queued_then_every_line_has_its_entry(
        client, celery, redis_client, monkeypatch):
    monkeypatch.setattr(batch_intake, "CHUNK", 3)
    held = HeldIntake(monkeypatch, allowed=0)
    text = "\n".join([lines(5), "{oops", line("r1"), line("r9", store=True), "", line("r10")])
    answer = start(client, text).get_json()
    assert answer["status"] == "validating" and answer["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    held.wait_held()
    assert celery.sent == []  # answered, and not one line queued yet
    assert client.get(f"/v1/batches/{answer['id']}").get_json()["status"] == "validating"
    held.gate.set()
    done = intake_done(client, answer["id"])
    assert done["status"] == "in_progress" and done["in_progress_at"]
    assert done["request_counts"] == {"total": 9, "completed": 0, "failed": 3}
    entries = BatchStore(redis_client).entries(answer["id"])
    assert [e["line"] for e in entries] == [1, 2, 3, 4, 5, 6, 7, 8, 10]  # input order over 3 chunks; line 9 blank
    assert [e.get("error", {}).get("code") for e in entries] == [
        None, None, None, None, None, "invalid_json_line", "duplicate_custom_id", "validation_error", None]
    assert [s["task_id"] for s in celery.sent] == [e["job_id"] for e in entries if "job_id" in e]


def test_a_line_over_the_body_cap_is_refused_by_its_size_never_parsed_nor_tokenized(make_app, celery, monkeypatch):
    parsed, counted = [], []
    real_parse, real_check = batch_lines.parse_line, PromptBudget.check
    monkeypatch.setattr(batch_lines, "parse_line", lambda n, text, endpoint: parsed.append(n) or
                        real_parse(n, text, endpoint))
    monkeypatch.setattr(PromptBudget, "check", lambda self, request, *a, **k: counted.append(request) or
                        real_check(self, request, *a, **k))
    client = make_app(max_body_bytes=10_000).test_client()
    huge = line("huge", content="é" * 3_000_000)  # 6 MB of UTF-8 on one line
    done = intake_done(client, start(client, "\n".join([line("small"), huge, line("after")])).get_json()["id"])
    assert done["request_counts"] == {"total": 3, "completed": 0, "failed": 1} and len(celery.sent) == 2
    assert parsed == [1, 3] and len(counted) == 2  # the huge line: neither parsed nor counted
    errors = [e for e in BatchStore(client.application.extensions["miniserve"].store.client).entries(done["id"])
              if "error" in e]
    assert [(e["line"], e["error"]["code"], e["error"]["status_code"]) for e in errors] == [(2, "line_too_large", 413)]
    assert errors[0]["error"]["message"].startswith("line 2: over 10000 bytes")


def test_a_batch_whose_intake_stopped_is_failed_by_the_next_reader_and_its_jobs_cancelled(
        client, celery, store, redis_client, monkeypatch):
    """The intake's process 'dies' after its first chunk (it hangs, then is seen stale); a
    later look fails the batch and cancels the jobs it had queued; when the hung intake wakes,
    it finds the batch failed and withdraws the jobs of the chunk it was in."""
    monkeypatch.setattr(batch_intake, "CHUNK", 2)
    held = HeldIntake(monkeypatch, allowed=3)  # chunk 1 (r0, r1) appended; r2 queued, r3 waits
    batch_id = start(client, lines(6)).get_json()["id"]
    held.wait_held()
    batches = BatchStore(redis_client)
    first_chunk = job_ids(batches, batch_id)
    assert len(first_chunk) == 2 and client.get(f"/v1/batches/{batch_id}").get_json()["status"] == "validating"
    redis_client.hset(keys.batch_key(batch_id), "progress_at", 0)  # its last progress: long ago
    failed = client.get(f"/v1/batches/{batch_id}").get_json()
    assert failed["status"] == "failed" and failed["failed_at"]
    assert [(e["code"], e["param"]) for e in failed["errors"]["data"]] == [("validation_interrupted", None)]
    assert [store.get(j).state for j in first_chunk] == [CANCELLED, CANCELLED]
    held.gate.set()  # the hung intake wakes, appends its chunk, sees the batch failed, stops

    def withdrawn() -> bool:
        return len(job_ids(batches, batch_id)) == 4 and store.get(celery.sent[3]["task_id"]).state == CANCELLED

    wait_until(withdrawn, 30, interval_s=0.01, what="the woken intake to withdraw its chunk")
    sent = [s["task_id"] for s in celery.sent]
    assert len(sent) == 4 and [store.get(j).state for j in sent] == [CANCELLED] * 4  # r4, r5 never queued
    assert client.get(f"/v1/batches/{batch_id}").get_json()["status"] == "failed"


def test_a_batch_cancelled_while_validating_ends_cancelled_with_no_open_job(client, celery, store, monkeypatch):
    monkeypatch.setattr(batch_intake, "CHUNK", 2)
    held = HeldIntake(monkeypatch, allowed=2)
    batch_id = start(client, lines(5)).get_json()["id"]
    held.wait_held()
    assert client.post(f"/v1/batches/{batch_id}/cancel").get_json()["status"] in ("cancelling", "cancelled")
    held.gate.set()
    wait_until(lambda: len(celery.sent) == 4 and store.get(celery.sent[-1]["task_id"]).state == CANCELLED, 30,
               interval_s=0.01, what="the intake to stop after the cancel")
    done = client.get(f"/v1/batches/{batch_id}").get_json()
    assert done["status"] == "cancelled"
    assert [store.get(s["task_id"]).state for s in celery.sent] == [CANCELLED] * 4


def test_a_file_deleted_before_its_lines_are_read_fails_the_batch_naming_the_file(client, monkeypatch):
    real = batch_intake.read_into
    gate = threading.Event()
    monkeypatch.setattr(batch_intake, "read_into", lambda store, intake: gate.wait(30) and real(store, intake))
    answer = start(client, lines(2)).get_json()
    assert client.delete(f"/v1/files/{answer['input_file_id']}").status_code == 200
    gate.set()
    done = intake_done(client, answer["id"])
    assert done["status"] == "failed" and done["errors"]["data"][0]["param"] == "input_file_id"
    assert done["errors"]["data"][0]["code"] == "file_not_found"


@pytest.mark.parametrize("text,expected", [
    ("a\nb", [(1, "a"), (2, "b")]), ("a\r\nb\r\n", [(1, "a"), (2, "b")]), ("\n\nc", [(1, ""), (2, ""), (3, "c")]),
    ("x\u2028y\n", [(1, "x\u2028y")]), ("", []),
])
def test_lines_are_cut_at_newlines_only(text, expected):
    assert list(batch_lines.split_lines(text)) == expected
