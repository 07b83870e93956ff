"""report.html: one self-contained page, opened in a real headless Chromium (Debian's ``chromium``
and ``chromium-driver``, which .ci/run installs) through selenium."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from common.observe.report_html import write_report
from helpers import REPO, TOY, read_summary, run

FAKE_NVML = str(REPO / "tests" / "fake_nvml")


def chromium():
    """A selenium driver for headless Chromium, or a skip saying in one line what is missing."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e .[test])")
    browser = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("no headless browser here: apt-get install chromium chromium-driver (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1200,1500"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(driver))


def test_the_report_opens_in_a_real_browser_with_every_figure_and_the_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("PYTHONPATH", FAKE_NVML)
    results = tmp_path / "r"
    proc = run([TOY, "12", "--sleep", "0.4", "--gpu", "all", "--fail-key", "item-0003", "--retries", "0",
                "--results", str(results), "--no-progress"])
    assert proc.returncode == 1, proc.stderr
    page = (results / "report.html").read_text()
    assert "http://" not in page and "https://" not in page  # nothing to fetch from anywhere
    browser = chromium()
    try:
        browser.get((results / "report.html").as_uri())
        figures = browser.execute_script(
            "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
        fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        counts = browser.find_element("id", "counts").text
        text = browser.find_element("tag name", "body").text
        shot = tmp_path / "report.png"
        assert browser.save_screenshot(str(shot))
    finally:
        browser.quit()
    print(f"screenshot: {shot}")
    assert sorted(alt for alt, *_ in figures) == ["GPU use over time", "timeline"], figures
    for alt, complete, width, height in figures:
        assert complete and width > 200 and height > 100, (alt, complete, width, height)
    assert fetched == [], fetched
    assert "11 of 12" in counts and "failed" in counts, counts
    summary = read_summary(results)
    assert summary["items_done"] == 11 and len(summary["failed_items"]) == 1
    assert "item-0003" in text and "RuntimeError: item item-0003 always fails" in text
    assert "rank0-gpu0" in text and "rank0-gpu1" in text  # the GPU table
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_html_in_an_error_message_is_shown_as_text_not_obeyed(tmp_path):
    summary = {"status": "failed", "items_done": 0, "items_total": 1, "failed_items": [{"key": "a", "error": "x"}],
               "workers": [], "started": "now"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "summary.md").write_text("# app: failed\n\n| item | error |\n|---|---|\n"
                                         "| a | ValueError: <img src=x onerror=alert(1)> <script>alert(2)</script> |\n\n"
                                         "![gone](gone.png)\n")
    page = write_report(tmp_path).read_text()
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert "figure gone.png is missing" in page
    assert not os.path.exists(tmp_path / "gone.png")
