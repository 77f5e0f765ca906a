"""The dashboard in a real browser (Debian's Chromium, headless, driven by Playwright) while a
job runs: the DAG changes state live through the event stream without a reload, the time
slider shows the job as it was at an earlier entry, the Gantt chart has one bar per attempt,
the queryable-state box says what is wrong, and nothing is loaded from another origin. A
screenshot of the job page is kept in $SLUICE_TEST_ARTIFACTS (build/test-artifacts)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.services.failover_helpers import job_state, keyed_graph, submit
from tests.ui.conftest import TOKEN
from tests.ui.driven import DrivenJob

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
ARTIFACTS = Path(
    os.environ.get("SLUICE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "build" / "test-artifacts")
)

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"no browser: {CHROMIUM} is missing (scripts/setup installs Debian's chromium with apt-get, as root)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """One headless Chromium for the module's tests (each gets a page of its own)."""
    sync_playwright = pytest.importorskip(
        "playwright.sync_api", reason="Playwright's Python package is missing: scripts/setup installs the dev extras"
    ).sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, served: str) -> Iterator:
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    p = context.new_page()
    p.requests = []  # every URL the page asked for
    p.on("request", lambda r: p.requests.append(r.url))
    yield p
    context.close()  # before the server stops: its event streams end with the page


@pytest.mark.timeout(90)
def test_the_job_page_follows_the_run_live_and_travels_back(driven: DrivenJob, served: str, page) -> None:
    from playwright.sync_api import expect

    driven.submit()
    driven.run()
    page.goto(f"{served}/jobs/j1")
    vertex = page.locator('svg.dag g.vertex[data-vertex="src"]')
    expect(vertex).to_have_attribute("data-status", "RUNNING")
    expect(vertex.locator("text.status")).to_have_text("RUNNING")
    page.evaluate("window.sameDocument = true")  # gone if the page reloads

    driven.fail_first()
    driven.finish()
    expect(vertex).to_have_attribute("data-status", "FINISHED")
    expect(vertex.locator("rect")).to_have_attribute("fill", "#74c476")
    expect(page.locator("#job-status")).to_have_text("FINISHED")
    expect(page.locator("#cancel-section")).to_be_hidden()  # nothing left to cancel
    assert page.evaluate("window.sameDocument") is True
    loads, told = (int(page.evaluate(f"document.body.dataset.{k}")) for k in ("loads", "sseEvents"))
    assert 1 <= loads <= told  # one fetch per event at most, never polling

    api = httpx.Client(base_url=served, timeout=10)
    now = api.get("/api/jobs/j1").json()
    expect(page.locator("svg.gantt g.bar")).to_have_count(len(now["attempts"]))
    assert len(now["attempts"]) == 3
    expect(page.locator('svg.gantt g.bar[data-attempt="src:0:0"]')).to_have_attribute("data-final", "FAILED")
    expect(page.locator("#root-text")).to_contain_text("cannot split line 17")
    expect(page.locator("#root-trace")).to_contain_text('File "job.py", line 7, in tokenize')

    # The slider to the first entry: the job as it was then.
    entries = now["entries"]
    slider = page.locator("#slider")
    expect(slider).to_have_attribute("max", str(len(entries) - 1))
    slider.focus()
    slider.press("Home")
    expect(page.locator("body")).to_have_attribute("data-shown-at", entries[0])
    first = api.get("/api/jobs/j1", params={"at": entries[0]}).json()
    expect(page.locator("#job-status")).to_have_text(first["job"]["status"])
    assert first["job"]["status"] != "FINISHED"
    expect(page.locator("svg.gantt g.bar")).to_have_count(len(first["attempts"]))

    # ...then forward to the entry where subtask 0 failed: two attempts, one failed.
    failed = next(e["entry"] for e in now["events"] if e.get("state") == "FAILED")
    for _ in range(entries.index(failed)):
        slider.press("ArrowRight")
    expect(page.locator("body")).to_have_attribute("data-shown-at", failed)
    expect(vertex).to_have_attribute("data-status", "FAILED")
    expect(page.locator("#job-status")).to_have_text("RUNNING")
    expect(page.locator("svg.gantt g.bar")).to_have_count(2)
    expect(page.locator("#moment")).to_contain_text(f"entry {entries.index(failed) + 1} of {len(entries)}")

    # The moment is in the address: reloading it (or sending it to someone) shows the same.
    expect(page).to_have_url(f"{served}/jobs/j1?at={failed}")
    page.reload()
    expect(page.locator("body")).to_have_attribute("data-shown-at", failed)
    expect(vertex).to_have_attribute("data-status", "FAILED")
    expect(slider).to_have_attribute("max", str(len(entries) - 1))
    expect(page.locator("#moment")).to_contain_text(f"entry {entries.index(failed) + 1} of {len(entries)}")

    page.locator("#live").click()
    expect(page.locator("body")).to_have_attribute("data-shown-at", "live")
    expect(vertex).to_have_attribute("data-status", "FINISHED")
    expect(page).to_have_url(f"{served}/jobs/j1")

    # The queryable-state box says what is wrong.
    box = page.locator(".state-box")
    box.locator('input[name="name"]').fill("nope")
    box.locator('input[name="key"]').fill("x")
    box.locator("button").click()
    result = page.locator(".state-result")
    expect(result).to_have_class("state-result error")
    expect(result).to_contain_text("no queryable state named 'nope'")

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-job.png"), full_page=True)

    # The TaskManagers as they were at a moment of the job.
    slider.focus()
    for _ in range(len(entries) - 1 - entries.index(failed)):
        slider.press("ArrowLeft")
    expect(page.locator("body")).to_have_attribute("data-shown-at", failed)
    page.locator("#tms-then").click()
    expect(page.locator(".moment")).to_contain_text(failed)
    held = api.get("/api/taskmanagers", params={"at": failed}).json()[0]["slots_in_use"]
    expect(page.locator("table.taskmanagers tbody tr")).to_contain_text(f"{held} / 2")
    assert held > 0

    assert page.requests and all(url.startswith(served) for url in page.requests), page.requests


@pytest.mark.timeout(60)
def test_the_other_pages_show_the_cluster(driven: DrivenJob, served: str, page) -> None:
    from playwright.sync_api import expect

    # The jobs page, open before the job is submitted, follows it to its end without a reload.
    page.goto(served)
    expect(page.locator("#jobs")).to_contain_text("none")
    page.evaluate("window.sameDocument = true")
    driven.submit()
    driven.run()
    row = page.locator("table.jobs tbody tr")
    expect(row).to_contain_text("RUNNING")
    expect(row).to_contain_text("0 / 2")
    driven.fail_first()
    driven.finish()
    expect(row).to_contain_text("FINISHED")
    expect(row).to_contain_text("2 / 2")
    assert page.evaluate("window.sameDocument") is True
    row.locator("a").click()
    expect(page).to_have_url(f"{served}/jobs/j1")
    expect(page.locator('svg.dag g.vertex[data-vertex="src"]')).to_have_attribute("data-status", "FINISHED")

    # The TaskManagers page follows its slots: a second job (src -> keyed agg) takes one.
    page.goto(f"{served}/taskmanagers")
    tm = page.locator("table.taskmanagers tbody tr")
    expect(tm).to_contain_text("tm-1")
    expect(tm).to_contain_text("0 / 2")
    submit(driven.log, driven.world, "j2", keyed_graph("j2"))
    driven._pump(lambda: len(driven.slots.launched) == 4, "j2's source deployed")
    expect(tm).to_contain_text("1 / 2")
    expect(tm).to_contain_text(": free")  # one slot of the two
    expect(tm.locator("a")).to_have_text("j2")

    # Drawn with its edge; its consumer not deployed yet.
    page.goto(f"{served}/jobs/j2")
    expect(page.locator("svg.dag g.vertex")).to_have_count(2)
    expect(page.locator("svg.dag g.edge")).to_have_count(1)
    expect(page.locator("svg.dag g.edge")).to_contain_text("keyed by id")
    expect(page.locator('svg.dag g.vertex[data-vertex="agg"]')).to_have_attribute("data-status", "CREATED")

    # Cancelling it from the page takes the dashboard's token.
    result = page.locator("#cancel-result")
    page.locator("#token").fill("a guess")
    page.locator("#cancel").click()
    expect(result).to_contain_text("the token sent is not the dashboard's")
    expect(result).to_have_class("error")
    page.locator("#token").fill(TOKEN)
    page.locator("#cancel").click()
    expect(result).to_have_text("cancel requested (the job was CREATED)")
    driven._pump(lambda: job_state(driven.log, "j2").status.value in ("CANCELLING", "CANCELED"), "j2's cancel")
    expect(page.locator("#job-status")).to_have_text(job_state(driven.log, "j2").status.value)

    page.goto(f"{served}/streams")
    expect(page.locator("table.streams")).to_contain_text("facts")

    page.goto(f"{served}/jobs/ghost")
    expect(page.locator("#dag .error")).to_contain_text("job 'ghost' not found")

    page.goto(f"{served}/state")
    box = page.locator(".state-box")
    for name, value in (("job", "ghost"), ("name", "counts"), ("key", "x")):
        box.locator(f'input[name="{name}"]').fill(value)
    box.locator("button").click()
    expect(page.locator(".state-result")).to_contain_text("ghost")
    expect(page.locator(".state-result")).to_have_class("state-result error")
