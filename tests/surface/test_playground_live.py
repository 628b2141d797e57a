"""The playground against a changing cluster, in headless Chromium on the real stack: a
stream that survives the web being killed and started again, and one that survives Redis
restarting (each reconnects, resumes with Last-Event-ID and says so), and the model picker
once a second model's worker joins. Each test asserts on what the page shows, checked
against the job the store holds."""
from __future__ import annotations

from pathlib import Path

import pytest
import requests

from core.routing import ALIVE_S
from tests.harness.stack import Stack, free_port, wait_until
from tests.integration.conftest import WORKER_ENV, _started_worker, stack_store, started_web, wait_for_worker
from tests.reliability.conftest import RestartableRedis
from tests.surface.test_monitor_page import CHROMIUM
from tests.surface.test_playground_page import answer, browser, send  # noqa: F401  (fixture)
from tests.tiny_model import make_tiny_model_dir

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")]


def open_page(browser, url: str):  # noqa: F811
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(url)
    return context, page


def streamed_text(store, job_id: str) -> str:
    return "".join(e.data["text"] for e in store.events(job_id) if e.type == "token")


def start_long_answer(page) -> str:
    page.fill("#max_new_tokens", "2000")
    page.fill("#stop", "<never>")
    send(page, "Write a long story")
    page.wait_for_function("document.querySelector('#conversation .turn.assistant .text').textContent.length > 0")
    return page.locator("#conversation .turn.assistant").get_attribute("data-job-id")


def check_resumed(page, store, job_id: str, why: str) -> None:
    """The page said the stream was lost (and why), then that it resumed; its text is the
    job's streamed text: nothing lost, nothing shown twice."""
    page.locator("#connection.resumed").wait_for()
    note = page.locator("#connection").inner_text()
    assert "reconnected after" in note and "resumed after event" in note, note
    lost = page.locator("#conversation .turn.assistant .note", has_text="connection lost").inner_text()
    assert why in lost, lost
    # Stop the answer if it is still running. One step in the page: the job may end between a
    # check here and a click there, and a disabled button would make the click wait forever.
    page.evaluate("() => { const b = document.querySelector('#stop-button'); if (!b.disabled) b.click(); }")
    turn = answer(page, 0)
    job = store.get(job_id)
    assert turn.get_attribute("data-state") == job.state and job.state in ("succeeded", "cancelled")
    assert turn.locator(".text").inner_text() == streamed_text(store, job_id)
    assert "nothing lost" in turn.locator(".note", has_text="reconnected").inner_text()


def test_a_stream_survives_a_web_restart(browser, surface_stack, surface_store, surface_worker):  # noqa: F811
    port = free_port()
    web, url = started_web(surface_stack, port)
    context, page = open_page(browser, url)
    try:
        job_id = start_long_answer(page)
        web.kill()  # the web and its gunicorn workers die with the stream open
        page.locator("#connection.lost").wait_for()
        web, _ = started_web(surface_stack, port)  # the same address again
        check_resumed(page, surface_store, job_id, "the web server did not answer")
    finally:
        context.close()
        web.kill()


@pytest.fixture(scope="module")
def blip_stack(tmp_path_factory, tiny_model):
    """A stack of its own on a Redis that can restart (append-only file on): web, one worker."""
    server = RestartableRedis(tmp_path_factory.mktemp("redis-data"), free_port())
    server.start()
    stack = Stack(redis_url=server.url, env_overrides={**WORKER_ENV, "MINISERVE_MODEL": str(tiny_model)})
    store = stack_store(stack)
    worker = _started_worker(stack, store)
    web, url = started_web(stack)
    yield server, store, url
    web.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here
    if server.proc is not None:
        server.proc.kill()


def test_a_stream_survives_a_redis_restart(browser, blip_stack):  # noqa: F811
    server, store, url = blip_stack
    context, page = open_page(browser, url)
    try:
        job_id = start_long_answer(page)
        server.stop()  # the web ends the stream cleanly, then answers 503 until Redis is back
        page.locator("#connection.lost").wait_for()
        server.start()
        check_resumed(page, store, job_id, "the server closed the stream")
    finally:
        context.close()


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny-beta", hidden_size=48, num_layers=1,
                               num_heads=4, num_kv_heads=1, seed=7, tie_word_embeddings=True)


def served_ids(base_url: str) -> list[str]:
    return sorted(m["id"] for m in requests.get(f"{base_url}/v1/models", timeout=10).json()["data"])


def test_the_model_picker_appears_with_a_second_model(browser, base_url, surface_stack, surface_store,  # noqa: F811
                                                      served_model, second_model):
    context, page = open_page(browser, base_url)
    assert page.locator("#model-box").is_hidden()  # one model: no picker, no `model` sent
    # a threads-pool worker: its stop removes its heartbeat at once (a prefork pool child's last
    # beat stays up to ALIVE_S), so the teardown's wait for one model served is short
    worker = _started_worker(surface_stack, surface_store, name="wb", pool="threads",
                             MINISERVE_MODEL=str(second_model))
    try:
        wait_for_worker(surface_store, count=2)
        page.reload()
        page.locator("#model-box").wait_for()
        options = page.locator("#model option").all_inner_texts()
        assert options == ["cluster default", *sorted([served_model, second_model.name])]
        page.select_option("#model", second_model.name)
        page.fill("#max_new_tokens", "6")
        send(page, "Hello")
        turn = answer(page, 0)
        job = surface_store.get(turn.get_attribute("data-job-id"))
        assert job.request["model"] == job.result["model"] == second_model.name and job.worker.startswith("wb@")
        assert turn.locator(".stats").inner_text().startswith(second_model.name)
        page.select_option("#model", "")
        send(page, "Hello again")
        job = surface_store.get(answer(page, 1).get_attribute("data-job-id"))
        assert job.result["model"] == served_model  # the cluster's default
    finally:
        context.close()
        worker.stop()
        # later tests see one model again (the picker hidden) once wb's heartbeat is gone
        wait_until(lambda: served_ids(base_url) == [served_model], ALIVE_S + 30, what="one model served")
