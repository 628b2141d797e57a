"""The playground against a changing cluster, in headless Chromium on the real stack: a
stream that survives the web being killed and started again (it reconnects, resumes with
Last-Event-ID and says so), and the model picker once a second model's worker joins.
Each test asserts on what the page shows, checked against the job the store holds."""
from __future__ import annotations

from pathlib import Path

import pytest
import requests

from core.routing import ALIVE_S
from tests.harness.stack import free_port, wait_until
from tests.integration.conftest import _started_worker, started_web, wait_for_worker
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


def test_a_stream_survives_a_web_restart(browser, surface_stack, surface_store, surface_worker):  # noqa: F811
    port = free_port()
    web, url = started_web(surface_stack, port)
    context, page = open_page(browser, url)
    try:
        page.fill("#max_new_tokens", "2000")
        page.fill("#stop", "<never>")
        send(page, "Write a long story")
        page.wait_for_function("document.querySelector('#conversation .turn.assistant .text').textContent.length > 0")
        job_id = page.locator("#conversation .turn.assistant").get_attribute("data-job-id")
        web.kill()  # the web and its gunicorn workers die with the stream open
        page.locator("#connection.lost").wait_for()
        assert "connection lost" in page.locator("#connection").inner_text()
        web, _ = started_web(surface_stack, port)
        page.locator("#connection.resumed").wait_for()
        note = page.locator("#connection").inner_text()
        assert "reconnected after" in note and "resumed after event" in note, note
        if surface_store.get(job_id).state == "running":
            page.click("#stop-button")
        turn = answer(page, 0)
        job = surface_store.get(job_id)
        assert turn.get_attribute("data-state") == job.state and job.state in ("succeeded", "cancelled")
        # nothing lost, nothing shown twice: the page's text is the job's streamed text
        assert turn.locator(".text").inner_text() == streamed_text(surface_store, job_id)
        assert "resumed after event" in turn.locator(".note", has_text="reconnected").inner_text()
    finally:
        context.close()
        web.kill()


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
    worker = _started_worker(surface_stack, surface_store, name="wb", MINISERVE_MODEL=str(second_model))
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
