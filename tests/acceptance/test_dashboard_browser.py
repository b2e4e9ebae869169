"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by ``scripts/test``) driven by Selenium.

``taskward up`` runs as a process (SQLite in tmp_path, a free port): a task submitted through the
API is seen reaching ``completed`` on its page without a reload, and a queued task whose target
no worker serves (``daytona``) is cancelled from its page and checked through the API. Under
``CI=true`` a missing browser fails these tests; elsewhere they skip with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 20.0


def _browser_problem() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(os.path.basename(path))):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    problem = _browser_problem()
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no browser under CI: {problem}")
        pytest.skip(problem)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``taskward up`` on 127.0.0.1:<free port> with its worker; yields the base URL."""
    tmp = tmp_path_factory.mktemp("up")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taskward.cli.main",
            "--db",
            f"sqlite:///{Path(tmp) / 'tw.db'}",
            "up",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp,
        env=env,
    )
    assert proc.stdout is not None
    base = None
    deadline = time.monotonic() + 30
    while base is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.search(r"dashboard:\s+(http://\S+)/", line)
        base = match.group(1) if match else None
    if base is None:
        proc.kill()
        pytest.fail(f"taskward up did not start: {proc.communicate()[1]}")
    try:
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0


def _submit(base: str, payload: dict[str, Any]) -> str:
    r = httpx.post(f"{base}/api/tasks", json=payload, timeout=10)
    assert r.status_code == 201, r.text
    task_id: str = r.json()["task_id"]
    return task_id


def _text(driver: Any, selector: str) -> str:
    """An element's text, read in one script call (the page redraws its regions while it
    polls, so a found element can go stale before it is read)."""
    text = driver.execute_script(
        "const el = document.querySelector(arguments[0]); return el ? el.textContent : null;",
        selector,
    )
    return "" if text is None else str(text).strip()


def _status_on_page(driver: Any) -> str:
    return _text(driver, '[data-field="status"]')


def _confirm(driver: Any) -> str:
    """Accept the confirmation a button with ``data-confirm`` asks for; returns its text."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(expected_conditions.alert_is_present())
    alert = driver.switch_to.alert
    text = str(alert.text)
    alert.accept()
    return text


def test_a_submitted_task_is_seen_completing_without_a_reload(browser: Any, service: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    task_id = _submit(
        service,
        {"action_kind": "command", "args": {"argv": ["sleep", "1.5"]}, "idempotency_key": "slow"},
    )
    browser.get(f"{service}/tasks/{task_id}")
    assert _status_on_page(browser) in {"queued", "running"}
    browser.execute_script("window.__sameDocument = true;")
    WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
        lambda d: _status_on_page(d) == "completed"
    )
    assert browser.execute_script("return window.__sameDocument === true;"), "the page reloaded"
    timeline = _text(browser, '[data-region="timeline"]')
    assert "queued \u2192 running" in timeline
    assert "running \u2192 completed" in timeline
    # The overview counts it too, by status and target.
    browser.get(f"{service}/")
    assert "completed" in _text(browser, '[data-region="counts"]')


def test_a_task_no_worker_serves_is_cancelled_from_its_page(browser: Any, service: str) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    task_id = _submit(
        service,
        {
            "action_kind": "command",
            "args": {"argv": ["echo", "<b>never runs</b>"]},
            "execution_target": "daytona",
        },
    )
    browser.get(f"{service}/tasks/{task_id}")
    assert _status_on_page(browser) == "queued"
    assert "daytona" in _text(browser, '[data-field="placement"]')
    assert "<b>never runs</b>" in _text(browser, '[data-region="args"]')  # text, not markup
    browser.find_element(By.ID, "cancel-button").click()
    assert _confirm(browser).startswith("Cancel this task?")
    try:
        WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
            lambda d: _status_on_page(d) == "cancelled"
        )
    except TimeoutException:
        pytest.fail(
            f"not cancelled on the page: {browser.current_url}\n{browser.page_source[:2000]}"
        )
    assert not browser.find_element(By.CSS_SELECTOR, '[data-region="cancel"]').is_displayed()
    task = httpx.get(f"{service}/api/tasks/{task_id}", timeout=10).json()
    assert task["status"] == "cancelled"
    facts = httpx.get(f"{service}/api/tasks/{task_id}/transitions", timeout=10).json()
    assert [(f["previous_status"], f["status"]) for f in facts["transitions"]] == [
        ("queued", "cancelled")
    ]
    assert facts["transitions"][0]["actor"] == "operator:anonymous"


def test_an_ended_task_is_retried_from_its_page_and_the_two_link(
    browser: Any, service: str
) -> None:
    """The retry button appears when the task ends, without a reload; it leads to the new task,
    which links back ("Retry of"), and the original lists it ("Retried as")."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    task_id = _submit(
        service,
        {"action_kind": "command", "args": {"argv": ["echo", "x"]}, "execution_target": "daytona"},
    )
    browser.get(f"{service}/tasks/{task_id}")
    assert not browser.find_element(By.ID, "retry-button").is_displayed()
    r = httpx.post(f"{service}/api/tasks/{task_id}/cancel", timeout=10)
    assert r.status_code == 200, r.text
    WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
        lambda d: d.find_element(By.ID, "retry-button").is_displayed()
    )
    browser.find_element(By.ID, "retry-button").click()
    _confirm(browser)
    WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
        lambda d: "/tasks/" in d.current_url and not d.current_url.endswith(task_id)
    )
    new_id = browser.current_url.rsplit("/", 1)[1]
    assert _text(browser, '[data-region="retry-of"]') == task_id
    assert _status_on_page(browser) == "queued"
    browser.get(f"{service}/tasks/{task_id}")
    assert browser.find_element(By.CSS_SELECTOR, '[data-region="retried"]').is_displayed()
    assert new_id in _text(browser, '[data-region="retries"]')


def test_bulk_retry_retries_the_tasks_the_list_shows_now(browser: Any, service: str) -> None:
    """The list filtered to cancelled keeps the ids its form sends current while it polls: a
    task cancelled after the page was opened is retried with the rest."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def daytona() -> str:
        return _submit(
            service,
            {"action_kind": "command", "args": {"argv": ["true"]}, "execution_target": "daytona"},
        )

    def shown_ids(driver: Any) -> list[str]:
        value = driver.execute_script(
            "return document.querySelector('[data-region=\"bulk-ids\"]').value;"
        )
        return str(value).split()

    first = daytona()
    httpx.post(f"{service}/api/tasks/{first}/cancel", timeout=10).raise_for_status()
    browser.get(f"{service}/tasks?status=cancelled")
    assert first in shown_ids(browser)
    later = daytona()
    httpx.post(f"{service}/api/tasks/{later}/cancel", timeout=10).raise_for_status()
    WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(lambda d: later in shown_ids(d))
    ids = shown_ids(browser)
    assert _text(browser, '[data-region="bulk-count"]') == str(len(ids))
    browser.find_element(By.ID, "bulk-retry-button").click()
    _confirm(browser)
    WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
        lambda d: d.current_url.endswith("/tasks/bulk-retry")
    )
    assert f"Retried {len(ids)} of {len(ids)} tasks" in _text(browser, "h1")
    for task_id in (first, later):
        assert task_id in _text(browser, "#retried")


def _live_polls(driver: Any) -> int:
    """How many times the page has redrawn its regions from a poll since it was loaded."""
    return int(driver.execute_script("return window.__polls || 0;"))


def _count_polls(driver: Any) -> None:
    """Count the page's polls: the live indicator's text changes on each one."""
    driver.execute_script(
        "window.__polls = 0;"
        "new MutationObserver(function () { window.__polls += 1; })"
        ".observe(document.getElementById('live'), {childList: true, characterData: true,"
        " subtree: true});"
    )


def test_a_kind_is_paused_and_resumed_from_the_limits_page(browser: Any, service: str) -> None:
    """The kinds table's pause button (as the page's script redraws it while polling) pauses
    the kind; a queued task of it says "held by limit", linking to the limit, where the
    resume button lifts the pause. Checked through the API."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def button(driver: Any, kind: str, label: str) -> Any:
        return driver.find_element(
            By.XPATH,
            f'//div[@data-region="kinds"]//tr[td[1]="{kind}"]//button[.="{label}"]',
        )

    def limits() -> dict[str, Any]:
        r = httpx.get(f"{service}/api/limits", timeout=10)
        assert r.status_code == 200, r.text
        return {x["limit_key"]: x for x in r.json()["limits"]}

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.1)
    try:
        browser.get(f"{service}/limits")
        _count_polls(browser)
        wait.until(lambda d: _live_polls(d) > 0)  # the buttons now are the script's own
        button(browser, "command", "pause").click()
        wait.until(lambda d: "done=paused" in d.current_url)
        assert _text(browser, "#flash").startswith("paused kind:command")
        assert limits()["kind:command"]["paused"] is True

        task_id = _submit(
            service,
            {
                "action_kind": "command",
                "args": {"argv": ["true"]},
                "execution_target": "daytona",
            },
        )
        browser.get(f"{service}/tasks/{task_id}")
        _count_polls(browser)
        wait.until(lambda d: _live_polls(d) > 0)
        placement = _text(browser, '[data-field="placement"]')
        assert placement == "held by limit kind:command \u2014 paused (max_running 0)"
        browser.find_element(By.CSS_SELECTOR, '[data-field="placement"] a').click()
        wait.until(lambda d: d.current_url.endswith("/limits?key=kind%3Acommand"))
        assert _text(browser, "td.chosen") == "kind:command"
        button(browser, "command", "resume").click()
        wait.until(lambda d: "done=resumed" in d.current_url)
        assert _text(browser, "#flash") == "resumed kind:command"
        assert "kind:command" not in limits()
    finally:  # the other tests of this module run command tasks
        httpx.post(f"{service}/api/kinds/command/resume", timeout=10)


def test_the_workflow_view_draws_a_chain_and_a_fan_in(
    browser: Any, service: str, tmp_path: Path
) -> None:
    """R21's workflow view of a small DAG (a chain a <- b <- c, and a fan-in c, d, e <- f) as
    Chromium renders it: one SVG node per task, one edge per link, a node links to its task's
    page (where "Depends on" lists its parents). A screenshot is written to tmp_path."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def task(key: str, *depends_on: str) -> str:
        # A target no worker serves: the tasks stay as admitted while the page is looked at.
        return _submit(
            service,
            {
                "action_kind": "command",
                "args": {"argv": ["true"]},
                "execution_target": "daytona",
                "idempotency_key": f"dag-{key}",
                "depends_on": list(depends_on),
            },
        )

    a = task("a")
    b = task("b", a)
    c = task("c", b)
    d, e = task("d"), task("e")
    f = task("f", c, d, e)
    browser.get(f"{service}/tasks/{f}")
    assert "waiting for 3 of 3 dependencies" in _text(browser, '[data-field="placement"]')
    browser.find_element(By.LINK_TEXT, "workflow view").click()
    WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
        lambda drv: drv.current_url.endswith(f"/tasks/{f}/graph")
    )
    drawn = browser.execute_script(
        "const svg = document.querySelector('svg.dag');"
        "const box = svg.getBoundingClientRect();"
        "return {nodes: Array.from(svg.querySelectorAll('a.dag-node'),"
        "  n => [n.getAttribute('data-task-id'), n.getAttribute('data-status'),"
        "        n.querySelector('rect').getBBox().x]),"
        " edges: svg.querySelectorAll('path.dag-edge').length,"
        " width: box.width, height: box.height};"
    )
    nodes = {task_id: (status, x) for task_id, status, x in drawn["nodes"]}
    assert set(nodes) == {a, b, c, d, e, f}
    assert drawn["edges"] == 5
    assert drawn["width"] > 0 and drawn["height"] > 0  # laid out, not an empty box
    assert nodes[a][0] == "queued" and nodes[f][0] == "waiting_dependency"
    assert nodes[a][1] == nodes[d][1] < nodes[b][1] < nodes[c][1] < nodes[f][1]
    shot = tmp_path / "workflow-graph.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"workflow view screenshot: {shot}")
    # A node is a link to its task's page.
    browser.find_element(By.CSS_SELECTOR, f'a.dag-node[data-task-id="{c}"]').click()
    WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
        lambda drv: drv.current_url.endswith(f"/tasks/{c}")
    )
    assert b in _text(browser, '[data-region="depends-on"]')
    assert f in _text(browser, '[data-region="needed-by"]')


# -- issue 28: charts, search, bulk actions, one output block, small screens ------------------

FORTY_LINES = "for i in $(seq 1 40); do echo output line $i; done; exit 3"


def _wait_status(base: str, task_id: str, statuses: set[str]) -> str:
    deadline = time.monotonic() + WAIT_S
    status = ""
    while time.monotonic() < deadline:
        status = httpx.get(f"{base}/api/tasks/{task_id}", timeout=10).json()["status"]
        if status in statuses:
            return status
        time.sleep(0.1)
    pytest.fail(f"task {task_id} is {status}, not {sorted(statuses)}")


def _overflow(driver: Any) -> list[str]:
    """What sticks out of the page sideways: the document's scroll width past the window's, and
    the first elements whose right edge passes it (a table's own scroller excepted)."""
    return list(
        driver.execute_script(
            "const w = document.documentElement.clientWidth;"
            "const out = [];"
            "if (document.documentElement.scrollWidth > w + 1)"
            "  out.push('document ' + document.documentElement.scrollWidth + ' > ' + w);"
            "for (const el of document.querySelectorAll('body *')) {"
            "  if (el.closest('.table-scroll, pre, .dag-scroll')) continue;"
            "  const r = el.getBoundingClientRect();"
            "  if (r.width && r.right > w + 1) out.push(el.tagName + '.' + el.className + ' '"
            "    + Math.round(r.right));"
            "  if (out.length > 5) break;"
            "}"
            "return out;"
        )
    )


def _shoot(driver: Any, folder: Path, name: str) -> Path:
    shot = folder / f"{name}.png"
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot {name}: {shot}")
    return shot


def test_pages_charts_search_bulk_retry_and_small_screens(
    browser: Any, service: str, tmp_path: Path
) -> None:
    """Every page renders; the overview's charts have data; a failed task's 40 lines of output
    show once, in one block, with their newlines, and its page shows no lease; the list's
    search finds a task by a string in its args; a failed task selected on the list is retried
    from there (a flash says so, the new task is linked from the old one); at 420 px nothing
    sticks out sideways. Screenshots of the overview, the list and the task page at 1280 and
    420 px go to tmp_path."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.1)
    done = _submit(
        service,
        {"action_kind": "command", "args": {"argv": ["echo", "zebra-marker-77"]}},
    )
    failed = _submit(
        service,
        {
            "action_kind": "command",
            "args": {"argv": ["sh", "-c", FORTY_LINES]},
            "max_attempts": 1,
        },
    )
    _wait_status(service, done, {"completed"})
    _wait_status(service, failed, {"failed"})

    # Every page renders (a page of an error has its title as h1).
    for path in ("/", "/tasks", f"/tasks/{failed}", "/workers", "/schedules", "/limits", "/outbox"):
        browser.get(f"{service}{path}")
        heading = _text(browser, "h1")
        assert heading and heading not in {"Not found", "Store unavailable", "Invalid input"}, path
        assert browser.execute_script("return document.querySelector('main') !== null;"), path

    # The overview: bars with values and a line of queue depth, per kind in use.
    browser.get(f"{service}/")
    drawn = browser.execute_script(
        "return {bars: Array.from(document.querySelectorAll('svg.chart-svg rect.bar'),"
        "  b => [b.closest('figure').querySelector('figcaption').textContent,"
        "        parseFloat(b.getAttribute('data-value')), b.getBBox().height]),"
        " lines: document.querySelectorAll('svg.chart-svg path.line').length,"
        " kinds: Array.from(document.querySelectorAll('.kind-charts h3'), h => h.textContent)};"
    )
    assert drawn["lines"] >= 1
    assert "command" in drawn["kinds"]
    assert any(value > 0 and height > 0 for _, value, height in drawn["bars"]), drawn
    assert any("command: tasks ended" in caption for caption, _, _ in drawn["bars"])
    _shoot(browser, tmp_path, "overview-1280")

    # The failed task's page: one output block with its 40 lines, no lease, readable evidence.
    browser.get(f"{service}/tasks/{failed}")
    output = browser.execute_script(
        "return document.querySelector('[data-region=\"output\"] pre').textContent;"
    )
    assert output.splitlines()[0] == "output line 1"
    assert output.splitlines()[-1] == "output line 40"
    body = str(browser.execute_script("return document.querySelector('main').innerText;"))
    assert body.count("output line 40") == 1, "the output is shown more than once"
    for gone in ("leased_by", "lease_expires", "deadline"):
        assert not browser.find_elements(By.CSS_SELECTOR, f'[data-field="{gone}"]')
    assert _text(browser, '[data-field="error"]') == "exit code 3"
    assert "UTC" in _text(browser, '[data-field="created"]')
    assert "output_tail" not in _text(browser, '[data-region="evidence"]')
    assert "live" in _text(browser, "#live")
    _shoot(browser, tmp_path, "task-1280")

    # Search by a string in the args.
    browser.get(f"{service}/tasks")
    box = browser.find_element(By.NAME, "q")
    box.send_keys("zebra-marker")
    box.submit()
    wait.until(lambda d: "q=zebra-marker" in d.current_url)
    found = browser.execute_script(
        "return Array.from(document.querySelectorAll('[data-region=\"tasks\"] td[title]'),"
        " td => td.getAttribute('title'));"
    )
    assert done in found and failed not in found
    assert _text(browser, '[data-region="count"]') == "1 task match"

    # Bulk retry of a selection: the failed task runs again as a new task.
    browser.get(f"{service}/tasks?status=failed")
    _shoot(browser, tmp_path, "tasks-1280")
    browser.find_element(By.CSS_SELECTOR, f'input.select[value="{failed}"]').click()
    assert _text(browser, "#selected-count") == "1 selected"
    browser.find_element(By.ID, "bulk-retry-selected").click()
    assert _confirm(browser).startswith("Retry the 1 selected tasks?")
    wait.until(lambda d: "done=retried" in d.current_url)
    assert _text(browser, "#flash").startswith("retried 1 of 1 selected tasks")
    browser.get(f"{service}/tasks/{failed}")
    retried = browser.execute_script(
        "return Array.from(document.querySelectorAll('[data-region=\"retries\"] a'),"
        " a => a.textContent);"
    )
    assert len(retried) == 1
    _wait_status(service, retried[0], {"queued", "running", "failed"})

    # At 420 px nothing sticks out sideways.
    browser.set_window_size(420, 900)
    try:
        for name, path in (
            ("overview", "/"),
            ("tasks", "/tasks"),
            ("task", f"/tasks/{failed}"),
            ("schedules", "/schedules"),
        ):
            browser.get(f"{service}{path}")
            width = browser.execute_script("return document.documentElement.clientWidth;")
            assert width <= 420
            assert _overflow(browser) == [], (path, _overflow(browser))
            if name != "schedules":
                _shoot(browser, tmp_path, f"{name}-420")
    finally:
        browser.set_window_size(1280, 900)
