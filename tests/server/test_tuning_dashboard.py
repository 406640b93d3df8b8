"""A tuning job's dashboard page in headless Chromium: listed beside the jobs, its children
with their values and objective, the best one marked, and the objective over time."""

from __future__ import annotations

from pathlib import Path

from tests.server.conftest import client, require_chromium, start_server
from tests.server.test_dashboard import ARGS
from tests.server.tuning_support import put_source, tuning_request, wait_tuning


def test_a_tuning_job_has_its_page(server_home: Path, tmp_path: Path) -> None:
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    put_source(server_home, tmp_path)
    server = start_server()
    try:
        sm = client(server)
        ranges = {
            "CategoricalParameterRanges": [
                {"Name": "kind", "Values": ["a"]},
                {"Name": "shift", "Values": ["1", "3", "5"]},
            ]
        }
        request = tuning_request("shown", "Grid", max_jobs=None, parallel=3, ranges=ranges)
        sm.create_hyper_parameter_tuning_job(**request)
        best = wait_tuning(sm, "shown")["BestTrainingJob"]["TrainingJobName"]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 1400})
                page.goto(server.dashboard_url())
                row = page.wait_for_selector('tr[data-tuning-job="shown"]', timeout=15_000)
                assert row is not None
                assert "Completed" in row.inner_text() and "3 completed" in row.inner_text()
                page.click("#tuning-jobs >> text=shown")
                page.wait_for_selector("#children tr[data-child]", timeout=15_000)
                children = page.locator("#children tr[data-child]")
                assert children.count() == 3
                shifts = sorted(children.nth(i).locator("td").nth(3).inner_text() for i in range(3))
                assert shifts == ["1", "3", "5"]
                marked = page.locator("#children tr.best")
                assert marked.count() == 1
                assert marked.get_attribute("data-child") == best
                charts = page.locator("#objective-charts .chart")
                assert charts.count() == 2
                assert page.locator("#objective-charts .chart canvas").count() == 2
                points = page.evaluate(
                    "[...document.querySelectorAll('#objective-charts .chart')]"
                    ".map(c => c.uplot.data[0].length)"
                )
                assert points == [3, 3]
                page.screenshot(path=str(tmp_path / "tuning-page.png"), full_page=True)
                page.click(f"#children >> text={best}")
                page.wait_for_selector("#job-status", timeout=15_000)
            finally:
                browser.close()
    finally:
        server.close()
