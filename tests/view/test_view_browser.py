"""The viewer in a real browser: headless Debian Chromium driven by Selenium through the Debian chromedriver.

Runs made in the test (conftest ``runs``) are served on loopback; the test clicks through the pages and
checks what is rendered. Skipped only where Chromium is not installed (``apt-get install -y chromium
chromium-driver``; ``make test`` installs both).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from view_runs import XSS, bisect, make_eval

from agentgym.view import Site, ViewServer, export_site

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 90.0
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-dev-shm-usage", "--window-size=1400,1000"]


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium chromium-driver); the browser tests need it")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="agentgym-view-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    old = os.environ.get("SE_OFFLINE")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager never downloads a browser or driver
    try:
        drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    finally:
        if old is None:
            os.environ.pop("SE_OFFLINE", None)
        else:
            os.environ["SE_OFFLINE"] = old
    drv.set_page_load_timeout(WAIT_S)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def site(runs: dict[str, Path]) -> Site:
    # runs 0 before, 1 after, 2 xss, 3 train (4, 5, 6: its eval stages)
    return Site([runs["before"], runs["after"], runs["xss"], runs["train"]], chunk_size=4)


@pytest.fixture(scope="module")
def server(site: Site) -> Iterator[ViewServer]:
    with ViewServer(site) as srv:
        yield srv


def wait(drv: Any, cond: Callable[[Any], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(drv, WAIT_S).until(cond, message=f"waited {WAIT_S:g} s for {what}")


def css(drv: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(drv.find_elements(By.CSS_SELECTOR, selector))


def wait_css(drv: Any, selector: str, n: int = 1) -> list[Any]:
    return wait(drv, lambda d: (els := css(d, selector)) and len(els) >= n and els, f"{n}x {selector}")


def open_page(drv: Any, url: str) -> None:
    drv.get("about:blank")  # a new document each time: no state left from the previous page
    drv.get(url)


def main_text(drv: Any) -> str:
    return str(drv.execute_script("return document.getElementById('main').innerText"))


def no_errors_shown(drv: Any) -> None:
    assert not css(drv, "#main .errbox"), main_text(drv)


def test_episode_from_the_list_renders_tool_calls_and_results(driver: Any, server: ViewServer, tmp_path: Path) -> None:
    open_page(driver, server.url + "#/run/2")
    rows = wait_css(driver, "tr[data-episode]", 6)
    assert "6 of 6 episodes" in main_text(driver)
    rows[0].click()
    wait_css(driver, ".chat .msg.assistant", 3)
    no_errors_shown(driver)
    assert driver.current_url.endswith("#/run/2/ep/0")
    calls = [e.text for e in css(driver, ".chat .call .fn")]
    assert calls and all(c == "→ guess" for c in calls)
    results = [e.text for e in css(driver, ".chat .msg.tool .body")]
    assert results[0] in ("higher", "lower") and results[-1] == "correct"
    assert "parse error: the tool call is not valid JSON" in css(driver, ".chat .perr")[0].text
    meta = css(driver, ".chat .msg.assistant .who .meta")[0].text
    assert "policy" in meta and "env" in meta  # per-turn timings
    assert [e.text for e in css(driver, ".chat .msg.system .who")] == ["SYSTEM"]
    shot = tmp_path / "episode.png"
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_agent_written_html_is_shown_as_text(driver: Any, server: ViewServer) -> None:
    open_page(driver, server.url + "#/run/2/ep/0")
    wait_css(driver, ".chat .msg.assistant", 2)
    bodies = [e.get_attribute("textContent") for e in css(driver, ".chat .msg.assistant .body")]
    assert any(XSS in b for b in bodies)  # the exact characters, as text
    assert driver.execute_script("return window.__agv_pwned === undefined")
    assert css(driver, "#main img") == [] and css(driver, "#main script") == []
    assert [e.text for e in css(driver, "#main b")] == ["End:"]  # the <b>bold</b> of the transcript is text
    # searching for the payload finds the episode and renders the list, still as text
    open_page(driver, server.url + "#/run/2")
    box = wait_css(driver, "input[type=search]")[0]
    box.send_keys("<script>window.__agv_pwned", "\n")
    wait(driver, lambda d: "matching" in main_text(d), "the search to finish")
    assert "6 of 6 episodes matching" in main_text(driver)
    assert driver.execute_script("return window.__agv_pwned === undefined")


def test_filters_and_search_narrow_the_episode_list(driver: Any, server: ViewServer, site: Site) -> None:
    from selenium.webdriver.support.ui import Select

    open_page(driver, server.url + "#/run/0")
    wait_css(driver, "tr[data-episode]", 12)
    Select(wait_css(driver, "select[data-filter=success]")[0]).select_by_value("no")
    wait(driver, lambda d: "4 of 12 episodes" in main_text(d), "the failure filter")
    tasks = sorted({e.text for e in css(driver, "tr[data-episode] td:nth-child(3)")})
    assert tasks == ["guess-43", "guess-53"]  # the `before` policy gives up above 35
    Select(css(driver, "select[data-filter=seed]")[0]).select_by_value("1")
    wait(driver, lambda d: "2 of 12 episodes" in main_text(d), "the seed filter")
    Select(css(driver, "select[data-filter=seed]")[0]).select_by_value("")
    Select(css(driver, "select[data-filter=success]")[0]).select_by_value("")
    wait(driver, lambda d: "12 of 12 episodes" in main_text(d), "filters cleared")
    box = css(driver, "input[type=search]")[0]
    box.send_keys("the SECRET was", "\n")  # give_up's result, case-insensitive
    wait(driver, lambda d: "matching" in main_text(d), "the search")
    assert "4 of 12 episodes matching “the SECRET was”" in main_text(driver)
    # the page's own filter function over the index rows, against a predicate written here
    rows = site.document("run/0")["table"]
    specs: list[dict[str, Any]] = [{}, {"success": "yes"}, {"success": "no", "seed": "0"}, {"task": "GUESS-4"},
                                   {"parse_errors": "yes"}, {"error": "no", "truncated": "no"}, {"env": "other"}]
    got = driver.execute_script("""
        var rows = AGV.filters.rowsOf(arguments[0]);
        return arguments[1].map(function (f) {
          return rows.filter(function (r) { return AGV.filters.rowMatches(r, f); }).map(function (r) { return r.id; });
        });""", rows, specs)
    n = len(rows["id"])
    want = [list(range(n)),
            [i for i in range(n) if rows["success"][i]],
            [i for i in range(n) if not rows["success"][i] and rows["seed"][i] == 0],
            [i for i in range(n) if "guess-4" in rows["task"][i]],
            [],
            list(range(n)),
            []]
    assert got == want


def test_breakdown_shows_pass_at_k_when_tasks_were_sampled_more_than_once(driver: Any, tmp_path: Path) -> None:
    run = make_eval(tmp_path / "k2", bisect(lambda lo, hi: lo > 35), seeds=[0], samples=2)
    with ViewServer(Site([run])) as srv:
        open_page(driver, srv.url + "#/run/0")
        cells = wait_css(driver, "td[data-passk]")
        no_errors_shown(driver)
        heads = [e.text for e in css(driver, "th")]
        assert "pass@k" in heads
        assert [c.text.split("\n") for c in cells] == [["@1 66.7%", "@2 66.7%"]]  # 4 of 6 tasks, both samples alike


def test_comparison_lists_flipped_tasks_and_shows_both_transcripts(driver: Any, server: ViewServer) -> None:
    open_page(driver, server.url + "#/compare/0,1")
    rows = wait_css(driver, "tr[data-task]", 3)
    no_errors_shown(driver)
    assert sorted(r.get_attribute("data-task") for r in rows) == ["guess-1", "guess-43", "guess-53"]
    text = main_text(driver)
    assert "2 gained" in text and "1 lost" in text and "3 same" in text
    next(r for r in rows if r.get_attribute("data-task") == "guess-43").click()
    columns = wait_css(driver, ".side > div", 2)
    wait_css(driver, ".side .chat", 2)
    left, right = columns[0].text, columns[1].text
    assert "give_up" in left and "FAIL" in left.upper()
    assert "correct" in right and "SUCCESS" in right.upper()
    # both policies bisect alike until the 4th turn, where `before` gives up: marked in both columns
    assert [e.get_attribute("data-turn") for e in css(driver, ".side .msg.assistant.diverge")] == ["3", "3"]


def test_training_run_curves_stages_and_groups(driver: Any, server: ViewServer) -> None:
    open_page(driver, server.url + "#/run/3")
    wait_css(driver, ".chart svg")
    no_errors_shown(driver)
    titles = [e.get_attribute("data-chart") for e in css(driver, ".chart")]
    assert titles == ["held-out success", "reward", "rollout success", "loss", "KL", "clip fraction", "entropy",
                      "tokens/s", "memory (GB)", "staleness"]
    assert len(css(driver, '.chart[data-chart="loss"] circle')) == 6
    points = css(driver, '.chart[data-chart="held-out success"] a')
    assert [p.get_attribute("data-stage") for p in points] == ["before", "step-000003", "after"]
    assert "1 line(s) of metrics.jsonl could not be read" in main_text(driver)
    wait_css(driver, "tr[data-group]", 6)
    css(driver, 'tr[data-group="0"]')[0].click()
    gate = wait_css(driver, "tr.gate")[0]
    assert "stopped the group here" in gate.text and "mean pairwise distance 0.050 < 0.12" in gate.text
    assert len(css(driver, ".grid thead th")) == 3  # step + two members side by side
    assert [e.text for e in css(driver, ".grid tbody tr:first-child pre")] == ["guess(n=31)", "guess(n=31)"]
    open_page(driver, server.url + "#/run/3")
    wait_css(driver, '.chart[data-chart="held-out success"] a', 3)
    driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))",
                          css(driver, '.chart[data-chart="held-out success"] a')[2])
    wait(driver, lambda d: d.current_url.endswith("#/run/6"), "the held-out point to open its stage")
    wait_css(driver, "tr[data-episode]", 12)


def test_export_opens_from_the_file_system_with_the_same_content(driver: Any, server: ViewServer, site: Site,
                                                                  tmp_path: Path) -> None:
    index = export_site(site, tmp_path / "export")
    for route, ready in (("#/run/2/ep/0", ".chat .msg.tool"), ("#/run/0", "tr[data-episode]"),
                         ("#/compare/0,1/task/4", ".side .chat"), ("#/run/3", ".chart svg"),
                         ("#/run/3/group/0", "tr.gate"), ("#/", ".card")):
        open_page(driver, server.url + route)
        wait_css(driver, ready)
        wait(driver, lambda d: not d.execute_script("return document.getElementById('status').textContent"), "loads")
        served = main_text(driver)
        open_page(driver, index.as_uri() + route)
        wait_css(driver, ready)
        assert driver.current_url.startswith("file://")
        no_errors_shown(driver)
        assert main_text(driver) == served, route
    assert driver.execute_script("return window.__agv_pwned === undefined")
    # the training page's "compare with before" links (one per later stage) open in the export too
    open_page(driver, index.as_uri() + "#/run/3")
    links = [a.get_attribute("href") for a in wait_css(driver, "tr[data-stage] a[href*='#/compare/']", 2)]
    assert [x.split("#")[1] for x in links] == ["/compare/4,5", "/compare/4,6"]
    for href in links:
        open_page(driver, href)
        wait(driver, lambda d: css(d, "tr[data-task]") or css(d, "#main .errbox"), "the comparison " + href)
        no_errors_shown(driver)
