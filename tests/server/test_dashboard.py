"""The dashboard in headless Chromium (Debian's package, driven by Playwright) against one
real server shared by the module, with a few real jobs: signing in (a key pair, a wrong
key, a wrong link, a stale cookie), finding, filtering, sorting and paging the list, a
two-host job whose algo-2 failed, a live log that follows, the Stop button, comparing two
jobs, per-host resource charts, a 400 px window, and no console errors throughout."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.server.conftest import (
    KEY_ID,
    SECRET,
    client,
    job,
    put,
    require_chromium,
    start_server,
    wait_for,
)
from trainport.server.app import TrainportServer
from trainport.server.asgi import vendor_present

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
WAIT = 60_000  # ms: page loads on a busy 2-core machine

# Each under 256 characters (a ContainerEntrypoint item's limit).
EPOCHS = (  # four epochs, about 2.4 s: long enough for resource samples
    "import time\n"
    "for i in range(4):print('epoch %d loss=%.3f'%(i,{scale}/(i+1)),flush=True);time.sleep(.6)\n"
)
HOSTS = (  # algo-2 fails after 2.5 s; algo-1 would run on
    "import os,json,time\n"
    "b=os.environ.get('SAGEMAKER_BASE_DIR','/opt/ml')\n"
    "h=json.load(open(b+'/input/config/resourceconfig.json'))['current_host']\n"
    "print('host',h,flush=True);time.sleep(2.5 if h=='algo-2' else 30)\n"
    "print('bad shard on',h,flush=True);exit(3)\n"
)
CHATTY = (  # a long log at once, then a line every 0.2 s until stopped
    "import time\n"
    "for i in range(1200):print('line',i,flush=True)\n"
    "i=1200\n"
    "while 1:print('line',i,flush=True);i+=1;time.sleep(.2)\n"
)


class Site:
    """The module's server, its jobs, and a signed-in browser page."""

    def __init__(
        self, home: Path, server: TrainportServer, sm: Any, page: Any, browser: Any
    ) -> None:
        self.home = home
        self.server = server
        self.sm = sm
        self.page = page
        self.browser = browser
        self.console_errors: list[str] = []

    def open(self, hash_: str = "#/", query: str = "") -> Any:
        self.page.goto(f"{self.server.url}/{query}{hash_}")
        return self.page


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    chromium = require_chromium()
    require(vendor_present(), "uPlot is not fetched: run scripts/fetch-dashboard-vendor.sh")
    from playwright.sync_api import sync_playwright

    home = tmp_path_factory.mktemp("dashboard") / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINPORT_HOME", str(home))
        for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "TRAINPORT_STORE"):
            mp.delenv(var, raising=False)
        mp.delenv("TRAINPORT_RUNNER", raising=False)
        mp.setenv("TRAINPORT_SERVER_KEYS", f"{KEY_ID}:{SECRET}")
        mp.setenv("TRAINPORT_STOP_GRACE_SECONDS", "5")
        mp.setenv("TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER", "1")
        put(home, "data", "train/part-0.txt", "one\ntwo\n")
        server = start_server()
        try:
            sm = client(server)
            sm.create_training_job(**job("alpha-run", EPOCHS.format(scale=1)))
            beta = job(
                "beta-run", EPOCHS.format(scale=2), HyperParameters={"epochs": "3", "lr": "0.2"}
            )
            sm.create_training_job(**beta)
            two = job(
                "two-hosts",
                HOSTS,
                ResourceConfig={
                    "InstanceType": "ml.m5.large",
                    "InstanceCount": 2,
                    "VolumeSizeInGB": 1,
                },
                Environment={"SECRET_TOKEN": "do-not-show-me"},
                Tags=[{"Key": "team", "Value": "vision"}],
            )
            sm.create_training_job(**two)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
                try:
                    context = browser.new_context(viewport={"width": 1200, "height": 1000})
                    page = context.new_page()
                    page.set_default_timeout(WAIT)
                    s = Site(home, server, sm, page, browser)
                    page.on(
                        "console",
                        lambda m: s.console_errors.append(m.text) if m.type == "error" else None,
                    )
                    page.on("pageerror", lambda e: s.console_errors.append(str(e)))
                    page.goto(server.dashboard_url())  # the printed link: sets the cookie
                    page.wait_for_selector("#jobs")
                    for name in ("alpha-run", "beta-run", "two-hosts"):
                        wait_for(sm, name)
                    yield s
                finally:
                    browser.close()
        finally:
            server.close()


def names_shown(page: Any) -> list[str]:
    return page.eval_on_selector_all("#jobs tbody tr", "rows => rows.map(r => r.dataset.job)")


def test_sign_in_with_a_key_pair_a_wrong_key_a_wrong_link_and_a_stale_cookie(site: Site) -> None:
    context = site.browser.new_context(viewport={"width": 1000, "height": 800})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(site.server.url + "/")
        page.wait_for_selector("form#signin")
        page.fill("#access-key-id", KEY_ID)
        page.fill("#secret-access-key", "not-the-secret")
        page.click("form#signin button[type=submit]")
        page.wait_for_selector("#signin-error:not([hidden])")
        assert "not one this server accepts" in page.inner_text("#signin-error")
        page.fill("#secret-access-key", SECRET)
        page.click("form#signin button[type=submit]")
        page.wait_for_selector('tr[data-job="alpha-run"]')
        cookie = next(c for c in context.cookies() if c["name"] == "trainport_dashboard")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert SECRET not in cookie["value"]

        page.click("#sign-out")
        page.wait_for_selector("form#signin")
        assert "signed out" in page.inner_text("#signin-message")
        page.goto(site.server.url + "/")
        page.wait_for_selector("form#signin")  # the cookie is gone

        # A wrong link shows the sign-in page with a message, not a file to download.
        page.goto(site.server.url + "/?token=wrong")
        page.wait_for_selector("form#signin")
        assert "wrong or out of date" in page.inner_text("#signin-message")

        # A cookie no key gives (the keys changed since) says the sign-in went stale.
        context.add_cookies(
            [{"name": "trainport_dashboard", "value": "0" * 40, "url": site.server.url}]
        )
        page.goto("about:blank")  # a fresh load of the page, as a later visit would be
        page.goto(site.server.url + "/#/")
        page.wait_for_selector("form#signin")
        assert "no longer valid" in page.inner_text("#signin-message")
        # Only the wrong key pair's refusal reached the console: the sign-in page itself
        # makes no request that fails.
        assert len(errors) == 1 and "403" in errors[0], errors
    finally:
        context.close()


def ran_seconds(job: dict[str, Any]) -> int:
    """A job's duration as the list shows it: start (or creation) to end (or last change)."""
    start = job.get("TrainingStartTime") or job["CreationTime"]
    end = job.get("TrainingEndTime") or job["LastModifiedTime"]
    return max(0, round((end - start).total_seconds()))


def test_find_filter_sort_and_page_the_list(site: Site) -> None:
    page = site.open("#/")
    page.wait_for_selector('tr[data-job="two-hosts"]')
    page.fill("#search", "alph")
    page.wait_for_function("document.querySelectorAll('#jobs tbody tr').length === 1")
    assert names_shown(page) == ["alpha-run"]
    page.fill("#search", "")
    page.wait_for_function("document.querySelectorAll('#jobs tbody tr').length === 3")
    page.select_option("#status-filter", "Failed")
    page.wait_for_function("document.querySelectorAll('#jobs tbody tr').length === 1")
    assert names_shown(page) == ["two-hosts"]
    page.select_option("#status-filter", "")
    page.wait_for_function("document.querySelectorAll('#jobs tbody tr').length === 3")

    page.click('th[data-sort="Name"]')  # by the API, ascending first
    page.wait_for_selector('th[data-sort="Name"][aria-sort="ascending"]')
    page.wait_for_function("document.querySelector('#jobs tbody tr').dataset.job === 'alpha-run'")
    assert names_shown(page) == ["alpha-run", "beta-run", "two-hosts"]
    page.click('th[data-sort="Name"]')
    page.wait_for_function("document.querySelector('#jobs tbody tr').dataset.job === 'two-hosts'")
    assert names_shown(page) == ["two-hosts", "beta-run", "alpha-run"]
    page.click('th[data-sort="Duration"]')  # sorted on the page, longest first
    page.wait_for_selector('th[data-sort="Duration"][aria-sort="descending"]')
    # Which job ran longest depends on the machine's load: the API's durations decide.
    took = {
        name: ran_seconds(site.sm.describe_training_job(TrainingJobName=name))
        for name in names_shown(page)
    }
    shown = [took[name] for name in names_shown(page)]
    assert shown == sorted(shown, reverse=True), took

    # Two jobs a page: the next page follows the API's NextToken.
    page = site.open("#/", "?size=2")
    page.click('th[data-sort="Name"]')
    page.wait_for_function("document.querySelector('#jobs tbody tr').dataset.job === 'alpha-run'")
    assert names_shown(page) == ["alpha-run", "beta-run"]
    page.click("#next-page")
    page.wait_for_function("document.querySelector('#jobs tbody tr').dataset.job === 'two-hosts'")
    assert names_shown(page) == ["two-hosts"]
    assert page.is_disabled("#next-page")
    page.click("#prev-page")
    page.wait_for_function("document.querySelector('#jobs tbody tr').dataset.job === 'alpha-run'")


def test_a_two_host_job_shows_the_failed_hosts_log_and_each_hosts_resources(site: Site) -> None:
    page = site.open("#/jobs/two-hosts")
    page.wait_for_selector("#host-picker .host-tab")
    tabs = page.eval_on_selector_all("#host-picker .host-tab", "ts => ts.map(t => t.dataset.host)")
    assert tabs == ["algo-2", "algo-1"]  # the failed host first, and shown first
    assert "failed" in page.get_attribute('#host-picker [data-host="algo-2"]', "class")
    page.wait_for_function("document.getElementById('log').textContent.includes('host algo-2')")
    assert "bad shard on algo-2" in page.inner_text("#log")
    page.click('#host-picker [data-host="algo-1"]')
    page.wait_for_function("document.getElementById('log').textContent.includes('host algo-1')")
    assert "algo-2" not in page.inner_text("#log")

    # Settings: what the request set, the Environment's names but never its values.
    settings = page.inner_text("#settings-table")
    assert "ml.m5.large \u00d7 2" in settings and "team=vision" in settings
    assert "SECRET_TOKEN" in settings and "do-not-show-me" not in page.content()
    assert "s3://data/train/ (File, FullyReplicated)" in settings
    assert "Failed" in page.inner_text("#job-status")
    assert "Failed" in page.inner_text("#transitions")

    # Resources: one series per host on each of the CPU and memory charts.
    for chart in ("cpu", "memory"):
        box = page.wait_for_selector(f'#resources .chart[data-chart="{chart}"]')
        assert box.get_attribute("data-series") == "algo-1,algo-2"
        assert page.locator(f'#resources .chart[data-chart="{chart}"] canvas').count() == 1
        legend = page.inner_text(f'#resources .chart[data-chart="{chart}"] .u-legend')
        assert "algo-1" in legend and "algo-2" in legend
    shot = page.screenshot(full_page=True)
    assert len(shot) > 10_000


def test_a_live_log_follows_its_newest_line_and_the_stop_button_stops(site: Site) -> None:
    site.sm.create_training_job(**job("chatty", CHATTY))
    log_file = site.home / "jobs" / "chatty" / "logs" / "algo-1.log"
    deadline = time.monotonic() + 60  # the long first part is in the log before the page opens
    while not log_file.exists() or len(log_file.read_bytes().splitlines()) < 1200:
        assert time.monotonic() < deadline, "chatty's first 1,200 lines never came"
        time.sleep(0.1)
    page = site.open("#/jobs/chatty")
    at_bottom = (
        "(p => p.scrollTop + p.clientHeight >= p.scrollHeight - 8)(document.getElementById('log'))"
    )
    lines = "document.getElementById('log').textContent.split('\\n').length"
    page.wait_for_function(f"{lines} > 1000")
    assert page.evaluate(
        "document.getElementById('log').scrollHeight > document.getElementById('log').clientHeight"
    )
    assert page.evaluate(at_bottom)
    seen = page.evaluate(lines)
    page.wait_for_function(f"{lines} > {seen + 3}")  # more lines came: still following
    assert page.evaluate(at_bottom)
    newest = page.evaluate("document.getElementById('log').textContent.trim().split('\\n').pop()")
    assert newest.startswith("line ")

    # Scrolled up, the reader stays where they are while lines arrive.
    page.evaluate("document.getElementById('log').scrollTop = 0")
    page.wait_for_selector("#follow-log:not([hidden])")
    seen = page.evaluate(lines)
    page.wait_for_function(f"{lines} > {seen + 3}")
    assert page.evaluate("document.getElementById('log').scrollTop") == 0
    page.click("#follow-log")
    assert page.evaluate(at_bottom)
    # It opened at the newest 1,000 lines; the earlier ones come on asking.
    assert not page.inner_text("#log").startswith("line 0\n")
    page.click("#earlier-log")
    page.wait_for_function("document.getElementById('log').textContent.startsWith('line 0\\n')")
    assert page.is_hidden("#earlier-log")

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop-job")
    page.wait_for_function(
        "['Stopping', 'Stopped'].includes(document.getElementById('job-status').textContent)"
    )
    assert wait_for(site.sm, "chatty")["TrainingJobStatus"] == "Stopped"
    page.wait_for_function("document.getElementById('job-status').textContent === 'Stopped'")
    assert page.is_hidden("#stop-job")


def test_compare_two_jobs_overlays_their_curves_and_marks_what_differs(site: Site) -> None:
    page = site.open("#/")
    page.click('th[data-sort="Name"]')
    page.wait_for_selector('tr[data-job="alpha-run"] input.select')
    page.check('tr[data-job="alpha-run"] input.select')
    page.check('tr[data-job="beta-run"] input.select')
    page.click("#compare")
    chart = page.wait_for_selector('#compare-charts .chart[data-chart="loss"]')
    assert chart.get_attribute("data-series") == "alpha-run,beta-run"
    assert page.locator('#compare-charts .chart[data-chart="loss"] canvas').count() == 1
    assert page.get_attribute('tr[data-row="hp:lr"]', "class") == "differs"
    assert page.get_attribute('tr[data-row="hp:epochs"]', "class") == ""
    assert page.inner_text('tr[data-row="metric:loss"]').split("\t")[1:] == ["0.25", "0.5"]
    # By epoch, as the log gives it: the x axis is the epoch, 0 to 3.
    page.check("#by-step")
    page.wait_for_function(
        "document.querySelector('#compare-charts .chart[data-chart=\"loss\"] .u-legend')"
        ".textContent.includes('epoch')"
    )
    xs = page.evaluate(
        "document.querySelector('#compare-charts .chart[data-chart=\"loss\"]').uplot.data[0]"
    )
    assert xs == [0, 1, 2, 3]


def test_at_400_px_nothing_overflows_and_the_favicon_is_served(site: Site) -> None:
    page = site.page
    page.set_viewport_size({"width": 400, "height": 800})
    try:
        for where in ("#/", "#/jobs/two-hosts", "#/compare/alpha-run,beta-run"):
            site.open(where)
            page.wait_for_selector("#jobs, #host-picker .host-tab, #compare-table")
            page.wait_for_timeout(300)  # charts drawn after the first data
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 400, f"{where} is {width} px wide"
    finally:
        page.set_viewport_size({"width": 1200, "height": 1000})
    with urllib.request.urlopen(site.server.url + "/favicon.ico") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "image/svg+xml"


def test_no_console_errors(site: Site) -> None:
    """Last in the module: every page the signed-in browser opened above logged none."""
    assert site.console_errors == []


def test_dashboard_actions_need_their_header_and_the_api_stays_sigv4(site: Site) -> None:
    url = site.server.url
    body = json.dumps({"accessKeyId": KEY_ID, "secretAccessKey": SECRET}).encode()
    request = urllib.request.Request(url + "/api/signin", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 403
    request.add_header("X-Trainport-Dashboard", "1")
    with urllib.request.urlopen(request) as resp:
        cookie = resp.headers["Set-Cookie"].split(";")[0]
    # The cookie opens the dashboard's reads, never the API.
    with urllib.request.urlopen(
        urllib.request.Request(url + "/api/jobs", headers={"Cookie": cookie})
    ) as resp:
        assert resp.status == 200
    api = urllib.request.Request(
        url + "/",
        data=b"{}",
        headers={
            "Cookie": cookie,
            "X-Amz-Target": "SageMaker.ListTrainingJobs",
            "Content-Type": "application/x-amz-json-1.1",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as unsigned:
        urllib.request.urlopen(api)
    assert unsigned.value.code == 403


def test_without_the_charting_library_the_page_says_so_and_shows_tables(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainport.server import asgi

    for path in list(asgi._VENDOR):  # as if scripts/fetch-dashboard-vendor.sh never ran
        monkeypatch.setitem(asgi._VENDOR, path, "vendor/not-fetched" + Path(path).suffix)
    context = site.browser.new_context(viewport={"width": 1000, "height": 800})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(site.server.dashboard_url())
        page.wait_for_selector("#jobs")
        page.goto(site.server.url + "/#/jobs/alpha-run")
        note = page.wait_for_selector("#charts-missing")
        assert "scripts/fetch-dashboard-vendor.sh" in note.inner_text()
        table = page.wait_for_selector('#charts .chart[data-chart="loss"] table.values')
        assert "0.25" in table.inner_text()
        assert errors == []
    finally:
        context.close()


@pytest.mark.parametrize(
    ("method", "path", "body", "said"),
    [
        ("GET", "/api/jobs?size=500", None, "size: expected a number of jobs from 1 to 100"),
        ("GET", "/api/jobs?sort=Duration", None, "sort: one of CreationTime, Name, Status"),
        ("GET", "/api/compare?jobs=alpha-run", None, "name from 2 to 10 jobs to compare"),
        ("GET", "/api/jobs/alpha-run/logs?stream=beta-run/algo-1-1", None, "not a stream of"),
        ("POST", "/api/signin", b'{"accessKeyId": "x"}', "give both accessKeyId and"),
        ("POST", "/api/signin", b"not json", "the sign-in body is not JSON"),
        ("POST", "/api/jobs/alpha-run/stop", b"{}", "it is already Completed"),
    ],
)
def test_bad_dashboard_requests_say_what_is_wrong(
    site: Site, method: str, path: str, body: bytes | None, said: str
) -> None:
    headers = {"Authorization": f"Bearer {site.server.dashboard.token}"}
    if method == "POST":
        headers["X-Trainport-Dashboard"] = "1"
    request = urllib.request.Request(site.server.url + path, data=body, method=method)
    for name, value in headers.items():
        request.add_header(name, value)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 400
    assert said in json.loads(refused.value.read())["message"]


def test_without_auth_everyone_is_signed_in_and_there_is_no_sign_out(server_home: Path) -> None:
    server = start_server(auth=False)
    try:
        with urllib.request.urlopen(server.url + "/api/session") as resp:
            assert json.loads(resp.read()) == {"signedIn": True, "auth": False, "message": None}
        with urllib.request.urlopen(server.url + "/api/jobs") as resp:
            assert json.loads(resp.read()) == {"jobs": [], "next": None}
    finally:
        server.close()
