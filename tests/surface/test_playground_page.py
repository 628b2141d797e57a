"""The playground at ``/`` in headless Chromium against the real stack on the tiny model:
a streamed multi-turn chat, a stopped answer, a JSON-schema answer, the API's own error,
a compare run of every method, an agent run's steps, and an offline load (nothing fetched
from outside; how fast it loads is measured by no test here: clocks belong in ``python -m bench``).
Each test asserts on what the page shows, checked against the job the store holds."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests

from core import keys
from core.settings import GENERATION_METHODS
from tests.harness.stack import REPO_ROOT, wait_until
from tests.harness.step_gate import StepGate
from tests.surface.test_monitor_page import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")]
SCREENSHOT = REPO_ROOT / "results" / "tmp" / "playground-test.png"  # ignored by git
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}  # short enough to end inside the token budget


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, base_url):
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(base_url)
    yield page
    context.close()


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")  # the keyboard sends


def answer(page, index: int):
    """The ``index``-th answer once it ended (its data-state is set)."""
    turn = page.locator("#conversation .turn:not(.user)").nth(index)
    turn.locator("xpath=self::*[@data-state]").wait_for()
    return turn


def test_page_loads_offline(browser, base_url):
    context = browser.new_context()
    local, outside = urlparse(base_url).netloc, []

    def only_local(route):
        if urlparse(route.request.url).netloc == local:
            return route.continue_()
        outside.append(route.request.url)
        return route.abort()

    context.route("**/*", only_local)
    page = context.new_page()
    page.goto(base_url, wait_until="load")
    assert page.locator("#send").is_enabled() and page.locator("#method option").count() == len(GENERATION_METHODS)
    page.set_viewport_size({"width": 390, "height": 800})  # a phone: one column, nothing cut off
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.locator("#settings").bounding_box()["y"] < page.locator("#prompt").bounding_box()["y"]
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "tab-chat"  # keyboard: the tabs come first
    page.keyboard.press("ArrowRight")
    assert page.locator("#view-compare").is_visible() and not page.locator("#view-chat").is_visible()
    context.close()
    assert outside == [], outside


def test_a_streamed_multi_turn_chat(page, surface_store):
    page.select_option("#method", "official")
    page.fill("#max_new_tokens", "12")
    send(page, "Hello there")
    first = answer(page, 0)
    assert first.get_attribute("data-state") == "succeeded"
    job = surface_store.get(first.get_attribute("data-job-id"))
    tokens = [e.data["text"] for e in surface_store.events(job.id) if e.type == "token"]
    assert first.locator(".text").inner_text() == "".join(tokens) == job.result["text"]
    stats = first.locator(".stats").inner_text()
    assert f"answer {job.result['usage']['completion_tokens']} tokens" in stats and "TTFT" in stats
    send(page, "And again")
    second = answer(page, 1)
    request = surface_store.get(second.get_attribute("data-job-id")).request
    assert [m["role"] for m in request["messages"]] == ["user", "assistant", "user"]
    assert request["messages"][1]["content"] == job.result["text"]


def test_the_stop_button_cancels_the_answer(page, surface_store, surface_worker):
    """The answer is caught mid-stream with the worker frozen, so it cannot end by itself
    before the test looks at the page and presses Stop, however busy the machine is."""
    page.fill("#max_new_tokens", "2000")
    page.fill("#stop", "<never>")
    index, job_id = _frozen_mid_answer(page, surface_store, surface_worker)
    try:
        assert page.locator("#send").is_disabled()
        page.click("#stop-button")
        wait_until(lambda: surface_store.client.exists(keys.cancel_key(job_id)), 30, what="the cancel request")
    finally:
        os.killpg(surface_worker.popen.pid, signal.SIGCONT)
    turn = answer(page, index)
    assert turn.get_attribute("data-state") == "cancelled"
    assert "cancelled" in turn.inner_text()
    assert surface_store.get(job_id).state == "cancelled"
    assert page.locator("#send").is_enabled()


def _frozen_mid_answer(page, store, worker, tries: int = 5) -> tuple[int, str]:
    """Send until an answer is streaming when the worker's process group is stopped (SIGSTOP);
    returns (its index, its job id). An answer that ended before the freeze is let finish and
    another is sent: the store says which happened, not a clock."""
    for index in range(tries):
        send(page, "Write a long story")
        page.wait_for_function(f"document.querySelectorAll('#conversation .turn.assistant .text')[{index}]"
                               "?.textContent.length > 0")
        os.killpg(worker.popen.pid, signal.SIGSTOP)
        job_id = page.locator("#conversation .turn:not(.user)").nth(index).get_attribute("data-job-id")
        if store.get(job_id).state == "running":
            return index, job_id
        os.killpg(worker.popen.pid, signal.SIGCONT)
        answer(page, index)
    raise AssertionError(f"{tries} answers ended before the worker could be frozen")


def test_a_json_schema_answer(page, surface_store):
    page.select_option("#guide", "schema")
    page.fill("#guide-text", json.dumps(SCHEMA))
    page.fill("#max_new_tokens", "48")
    send(page, "Is the sky blue?")
    turn = answer(page, 0)
    assert turn.get_attribute("data-state") == "succeeded"
    shown = json.loads(turn.locator(".text").inner_text())
    assert isinstance(shown["ok"], bool) and set(shown) == {"ok"}
    assert surface_store.get(turn.get_attribute("data-job-id")).result["text"] == turn.locator(".text").inner_text()


def test_the_apis_own_error_in_plain_words(page):
    page.fill("#max_new_tokens", "1000000")
    send(page, "Hello")
    turn = answer(page, 0)
    assert turn.get_attribute("data-state") == "rejected"
    assert "max_new_tokens" in turn.locator(".error").inner_text()
    page.fill("#max_new_tokens", "8")
    page.select_option("#guide", "schema")
    page.fill("#guide-text", "{not json")
    send(page, "Hello")
    assert "JSON schema: not valid JSON" in answer(page, 1).locator(".error").inner_text()


def test_compare_runs_every_method_and_the_texts_agree(page, surface_store):
    page.click("#tab-compare")
    page.fill("#max_new_tokens", "16")
    page.click("#compare-run")
    rows = page.locator("#compare-table tbody tr")
    page.wait_for_function(f"document.querySelectorAll('#compare-table tbody tr').length === {len(GENERATION_METHODS)}")
    for i in range(rows.count()):
        assert rows.nth(i).locator("td").nth(1).inner_text() == "succeeded"
        assert rows.nth(i).locator("td.same").inner_text() == "yes"
    jobs = [surface_store.get(c.get_attribute("data-job-id")) for c in page.locator("#compare-columns .column").all()]
    texts = {job.result["text"] for job in jobs}
    for job in jobs:  # the chart's legend: each method's tokens, as its job counted them
        shown = page.locator(f'#compare-legend [data-method="{job.result["method"]}"] .count').inner_text()
        assert int(shown) == job.result["usage"]["completion_tokens"], (job.result["method"], shown)
        counts = [e.data["tokens"] for e in surface_store.events(job.id) if e.type == "token"]
        assert counts == sorted(counts) and counts[-1] <= job.result["usage"]["completion_tokens"]
    assert len(texts) == 1 and "identical" in page.locator("#compare-status").inner_text()
    page.click("#compare-again")
    page.locator("#compare-again:not([disabled])").wait_for()
    cached = page.locator('#compare-table tr[data-method="prefix_cache"] td.cached').inner_text()
    assert int(cached.split("/")[1]) > 0, cached
    assert "prefix cache hit" in page.locator("#compare-status").inner_text()
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)


def test_an_agent_run_shows_its_steps(page, surface_store):
    page.check("#agent-mode")
    page.fill("#max_new_tokens", "24")
    send(page, "What is 17 * 23?")
    turn = answer(page, 0)
    job = surface_store.get(turn.get_attribute("data-job-id"))
    trace = (job.result or {}).get("trace") or (job.error or {}).get("trace") or []
    assert job.type == "agent" and trace, (job.state, job.error)
    assert turn.locator(".steps > li.step").count() == len(trace)
    first = turn.locator(".steps > li.step").first
    assert f"step {trace[0]['step']}" in first.inner_text()
    assert first.locator("details pre").text_content() == trace[0]["raw_output"]
    page.screenshot(path=str(SCREENSHOT.with_name("playground-agent-test.png")), full_page=True)


def test_the_kv_pool_fills_while_a_job_runs_and_empties_after(page, base_url, surface_store):
    with StepGate.on(surface_store).closed(steps=2):  # the job holds its blocks, running, until the gate opens
        response = requests.post(f"{base_url}/jobs", json={"prompt": "Tell me everything", "max_new_tokens": 64,
                                                           "stop": ["<never>"], "repetition_penalty": 1.0,
                                                           "generation_method": "paged"}, timeout=10)
        job_id = response.json()["id"]
        page.click("#tab-worker")
        page.locator("#pool-grid .cell").first.wait_for()
        # a heartbeat carries the loop's snapshot, taken while the gate holds the job
        page.wait_for_function("/in use [1-9]/.test(document.getElementById('pool-summary').textContent)")
        assert page.locator("#pool-grid .cell.used").count() > 0
        assert surface_store.get(job_id).state == "running"
        requests.post(f"{base_url}/jobs/{job_id}/cancel", timeout=10)
    page.wait_for_function("/in use 0 · shared 0/.test(document.getElementById('pool-summary').textContent)")
    assert page.locator("#pool-grid .cell.used, #pool-grid .cell.shared").count() == 0
    assert surface_store.get(job_id).state == "cancelled"
    total = page.locator("#pool-grid .cell").count()
    assert f"{total} blocks" in page.locator("#pool-summary").inner_text()
