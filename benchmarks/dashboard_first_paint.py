"""The dashboard's first paint with 1,000 jobs stored, measured in headless Chromium.

A server is started on a TRAINPORT_HOME holding ``--jobs`` finished jobs (the records of
``server_throughput.py``), and another on an empty one. For each, a fresh browser page
opens the dashboard (signed in by cookie) and reports, from the navigation's start:

- first contentful paint (the browser's own ``first-contentful-paint`` entry: the header);
- the job list painted: the first frame after the list's rows are in the page, measured
  with a MutationObserver and ``requestAnimationFrame`` from a script run before the page.

Rounds alternate between the two servers; each keeps its median. The comparison is the
list painted with the jobs against the same page with none (what the jobs add), and
against the goal of 1 s.

    python benchmarks/dashboard_first_paint.py [--jobs 1000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_throughput import fill

from trainport.config import load_settings
from trainport.jobs.db import JobDB
from trainport.server.app import ServerConfig, build_server

KEY_ID, SECRET = "TPAKBENCHMARK0000001", "benchmark-secret"
GOAL_MS = 1000.0

# Before the page's own scripts: note when the list's rows first exist, then the next frame.
WATCH = """
window.__listPainted = new Promise((resolve) => {
  const seen = () => document.querySelector('#jobs tbody tr, #no-jobs:not([hidden])');
  const done = () => requestAnimationFrame(() => resolve(performance.now()));
  new MutationObserver((_, obs) => { if (seen()) { obs.disconnect(); done(); } })
    .observe(document, { childList: true, subtree: true, attributes: true });
});
"""

FIRST_PAINT = """
new Promise((resolve) => {
  const look = () => {
    const entry = performance.getEntriesByName('first-contentful-paint')[0];
    entry ? resolve(entry.startTime) : setTimeout(look, 20);
  };
  look();
})
"""


def measure(browser: object, url: str, token: str) -> tuple[float, float, int]:
    """(first contentful paint ms, list painted ms, rows) for one fresh page."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})  # type: ignore[attr-defined]
    try:
        context.add_cookies([{"name": "trainport_dashboard", "value": token, "url": url}])
        page = context.new_page()
        page.add_init_script(WATCH)
        page.goto(url + "/#/")
        listed = page.evaluate("window.__listPainted")
        fcp = page.evaluate(FIRST_PAINT)
        rows = page.locator("#jobs tbody tr").count()
        return float(fcp), float(listed), rows
    finally:
        context.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    os.environ["TRAINPORT_SERVER_KEYS"] = f"{KEY_ID}:{SECRET}"
    with tempfile.TemporaryDirectory(prefix="trainport-bench-") as tmp:
        servers = {}
        for label, jobs in (("with jobs", args.jobs), ("no jobs", 0)):
            home = Path(tmp) / label.replace(" ", "-")
            settings = load_settings({**os.environ, "TRAINPORT_HOME": str(home)})
            if jobs:
                fill(JobDB(settings.db_path), settings.region, jobs)
            server = build_server(ServerConfig(port=0), settings)
            server.start_background()
            servers[label] = server
        results: dict[str, list[tuple[float, float, int]]] = {label: [] for label in servers}
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=chromium,
                    args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
                )
                try:
                    for server in servers.values():  # a warm-up page each
                        measure(browser, server.url, server.dashboard.token or "")
                    for turn in range(args.rounds):
                        order = list(servers) if turn % 2 == 0 else list(reversed(servers))
                        for label in order:
                            server = servers[label]
                            results[label].append(
                                measure(browser, server.url, server.dashboard.token or "")
                            )
                finally:
                    browser.close()
        finally:
            for server in servers.values():
                server.close()
    print(
        f"dashboard first paint, headless Chromium; {args.jobs} jobs stored; median of "
        f"{args.rounds} fresh pages each; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'server':12} {'first paint ms':>15} {'list painted ms':>16} {'rows':>6}")
    medians = {}
    for label, runs in results.items():
        fcp = statistics.median(r[0] for r in runs)
        listed = statistics.median(r[1] for r in runs)
        medians[label] = listed
        print(f"{label:12} {fcp:15.0f} {listed:16.0f} {runs[0][2]:6d}")
    with_jobs, without = medians["with jobs"], medians["no jobs"]
    print(
        f"list painted with {args.jobs} jobs: {with_jobs:.0f} ms = {with_jobs / without:.2f}x "
        f"the empty server's, {with_jobs / GOAL_MS:.2f}x the goal of {GOAL_MS:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
