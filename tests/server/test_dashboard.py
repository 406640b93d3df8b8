"""The dashboard in headless Chromium (Debian's package, driven by Playwright): the list
shows a job created through boto3, and its page shows the log lines and a metric chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.server.conftest import TRAIN, job, require_chromium, wait_for

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def test_dashboard_shows_job_logs_and_chart(sm: Any, server: Any, tmp_path: Path) -> None:
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    sm.create_training_job(**job("shown-in-browser", TRAIN))
    wait_for(sm, "shown-in-browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            # Without the token the data is refused, and the page says how to sign in.
            page.goto(server.url + "/")
            page.wait_for_selector("p.error", timeout=60_000)
            assert "sign in" in page.inner_text("p.error")
            page.goto(server.dashboard_url())  # sets the cookie, redirects to /
            row = page.wait_for_selector('tr[data-job="shown-in-browser"]', timeout=60_000)
            assert row is not None
            assert "Completed" in row.inner_text()
            page.screenshot(path=str(tmp_path / "dashboard-list.png"), full_page=True)

            page.click("text=shown-in-browser")
            page.wait_for_function(
                "document.getElementById('log') && "
                "document.getElementById('log').textContent.includes('epoch 3 loss=0.250')",
                timeout=60_000,
            )
            log_text = page.inner_text("#log")
            assert [ln for ln in log_text.splitlines() if ln.startswith("epoch")] == [
                f"epoch {i} loss={1 / (i + 1):.3f}" for i in range(4)
            ]
            chart = page.wait_for_selector('svg.metric-chart[data-metric="loss"]')
            assert chart is not None
            assert page.locator('svg.metric-chart[data-metric="loss"] circle').count() == 4
            assert "Completed" in page.inner_text("#transitions")
            assert page.get_attribute("#model-link", "href") == ("/api/jobs/shown-in-browser/model")
            shot = tmp_path / "dashboard-job.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
