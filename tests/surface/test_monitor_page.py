"""The monitor page in headless Chromium (Debian's, driven by Playwright; nothing is
downloaded): workers, a finished job, its events, and the cancel button on a running job."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import requests

from core.events import TERMINAL_STATES
from tests.harness.served import serve
from tests.harness.stack import REPO_ROOT, wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOT = REPO_ROOT / "results" / "tmp" / "monitor-test.png"  # ignored by git; README shows a real-model one
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")]


@pytest.fixture(scope="module")
def monitor_stack(tmp_path_factory, served_model_dir):
    """A stack of this module's own, not the surface stack the other modules share: the first
    test reads the worker's prefix-cache counters after its own two jobs (hits 1 / misses 1),
    which the prefix_cache jobs of test_openai_client and test_playground_page would have
    moved had they run first on the same worker."""
    yield from serve(tmp_path_factory, served_model_dir, MINISERVE_MAX_NEW_TOKENS_CAP="4000")


@pytest.fixture(scope="module")
def base_url(monitor_stack) -> str:
    return monitor_stack.base_url


@pytest.fixture(scope="module")
def surface_store(monitor_stack):
    return monitor_stack.store


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.set_default_timeout(20_000)
        yield page
        browser.close()


def submit(base_url: str, **body) -> str:
    response = requests.post(f"{base_url}/jobs", json={"prompt": "Hello, how are you?", **body}, timeout=10)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def wait_end(store, job_id: str) -> None:
    wait_until(lambda: store.get(job_id).state in TERMINAL_STATES, 60, what=f"job {job_id} to end")


def test_lists_workers_and_a_finished_job_and_shows_its_events(page, base_url, surface_store):
    for _ in range(2):  # the second one hits the worker's prefix cache
        cached = submit(base_url, max_new_tokens=4, prefix="You are a terse assistant.",
                        generation_method="prefix_cache")
        wait_end(surface_store, cached)
    paged = submit(base_url, max_new_tokens=4, generation_method="paged")
    wait_end(surface_store, paged)
    job_id = submit(base_url, max_new_tokens=16)
    wait_end(surface_store, job_id)
    page.goto(f"{base_url}/monitor")
    worker_row = page.locator("#workers tr.worker").first
    worker_row.wait_for()
    assert "float32" in worker_row.inner_text() and "cpu" in worker_row.inner_text()
    # cache statistics arrive with the worker's next heartbeat (every 5 s); the page polls
    page.locator("#workers tr.worker .cache", has_text="prefix_cache: hits 1 / misses 1").wait_for()
    assert "used (peak" in page.locator("#workers tr.worker .cache", has_text="paged:").inner_text()
    row = page.locator(f'#jobs tr[data-job-id="{job_id}"]')
    row.wait_for()
    assert "succeeded" in row.inner_text() and "generate" in row.inner_text()
    assert page.locator('#queues [data-queue="generation"]').count() == 1
    row.press("Enter")  # the keyboard opens it
    page.locator("#events li.event-done").wait_for()
    tokens = page.locator("#events li.event-token").count()
    assert tokens == sum(1 for e in surface_store.events(job_id) if e.type == "token") > 0
    assert page.locator("#output").inner_text() == surface_store.get(job_id).result["text"].strip() or tokens
    job = surface_store.get(job_id)
    # events in words, not JSON: the state with its worker, the end with its numbers
    assert f"running on {job.worker}" in page.locator("#events li.event-state").first.inner_text()
    done = page.locator("#events li.event-done").inner_text()
    assert f"finish: {job.result['finish_reason']}" in done and f"{job.result['usage']['completion_tokens']} tokens" in done
    assert page.locator("#summary").inner_text().startswith("succeeded")
    assert page.locator("#cancel").is_disabled()
    assert page.locator(f'#jobs tr[data-job-id="{job_id}"] a.playground-link').get_attribute("href") == f"/#job={job_id}"
    # the TTFT chart: one dot per job; its legend counts them per method, from the same rows
    page.locator('#ttft-legend [data-method="prefix_cache"][data-jobs="2"]').wait_for()
    assert "median" in page.locator('#ttft-legend [data-method="paged"]').inner_text()
    assert "waiting" in page.locator("#chart-now").inner_text()
    page.select_option("#filter-state", "running")
    page.wait_for_function("document.querySelectorAll('#jobs tr.job').length === 0")
    page.select_option("#filter-state", "")
    page.locator(f'#jobs tr[data-job-id="{job_id}"]').wait_for()
    page.set_viewport_size({"width": 390, "height": 800})  # a phone: wide tables scroll, the page does not
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.set_viewport_size({"width": 1400, "height": 1100})


def test_an_agent_job_shows_its_trace(page, base_url, surface_store):
    response = requests.post(f"{base_url}/jobs", json={"type": "agent", "prompt": "What is 17 * 23?",
                                                       "max_steps": 2, "max_new_tokens": 24}, timeout=10)
    job_id = response.json()["id"]
    wait_end(surface_store, job_id)
    job = surface_store.get(job_id)
    steps = (job.result or {}).get("trace") or (job.error or {}).get("trace") or []
    assert steps, (job.state, job.result, job.error)
    page.goto(f"{base_url}/monitor#job={job_id}")
    page.locator("#trace-box:not([hidden])").wait_for()
    assert page.locator("#trace > li.step").count() == len(steps)
    first = page.locator("#trace > li.step").first
    tool = f"tool {steps[0]['tool_name']}" if steps[0].get("tool_name") else "no usable tool call"
    assert first.locator(".step-title").inner_text() == f"step {steps[0]['step']}: {tool}"  # words, not JSON
    assert first.locator("details pre").text_content() == steps[0]["raw_output"]
    assert page.locator("#events li.event-tool_step li.step").count() == len(steps)  # the live events too
    assert page.locator(f'#jobs tr[data-job-id="{job_id}"]').inner_text().split("\t")[1] == "agent"
    page.click("#detail-playground")  # the same job in the playground: its prompt, then its steps
    page.wait_for_url(f"**/#job={job_id}")
    turn = page.locator("#conversation .turn.agent")
    turn.locator("xpath=self::*[@data-state]").wait_for()
    assert page.locator("#conversation .turn.user .text").inner_text() == "What is 17 * 23?"
    assert turn.get_attribute("data-state") == job.state and turn.locator(".steps > li.step").count() == len(steps)


def test_the_cancel_button_cancels_a_running_job(page, base_url, surface_store):
    job_id = submit(base_url, max_new_tokens=2000, stop=["<never>"], repetition_penalty=1.0)
    wait_until(lambda: surface_store.get(job_id).state == "running", 30, what="the job to start")
    page.goto(f"{base_url}/monitor#job={job_id}")
    page.locator("#events li.event-token").first.wait_for()  # live events arrive while it runs
    page.locator("#cancel:not([disabled])").click()
    wait_end(surface_store, job_id)
    assert surface_store.get(job_id).state == "cancelled"
    page.locator("#events li.event-cancelled").wait_for()
    page.wait_for_function("document.getElementById('detail-state').textContent === 'cancelled'")
    page.locator(f'#jobs tr[data-job-id="{job_id}"] td.state-cancelled').wait_for()
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 10_000
