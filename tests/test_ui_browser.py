"""The playground in a real headless Chromium (Debian's chromium, driven by Playwright)."""

from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import expect, sync_playwright
from ui_pair import MAX_TOKENS, PROMPT

from ui import headless

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


@pytest.fixture(scope="module")
def page():
    with sync_playwright() as p:
        browser = headless.launch(p)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        yield page
        browser.close()


def test_prompt_run_shows_colored_cycles_verdict_and_charts(served, page):
    page.goto(served[0])
    prompt = page.locator("#prompt textarea")
    prompt.fill(PROMPT)
    page.locator("#max-tokens input[type=number]").fill(str(MAX_TOKENS))
    page.locator("#max-tokens input[type=number]").press("Enter")
    page.locator("#run").click()
    expect(page.locator("#lossless")).to_contain_text("identical", timeout=120_000)
    assert page.locator("#dflash-tokens .tok-accepted").count() > 0
    assert page.locator("#dflash-tokens .tok-rejected").count() > 0
    assert page.locator("#dflash-tokens .tok-target").count() > 0
    assert page.locator("#baseline-output .out").inner_text().strip()
    expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=30_000)
    assert page.locator(".js-plotly-plot").count() >= 2
    # the inspector shows a cycle and the race replays on one clock
    expect(page.locator("#inspector")).to_contain_text("cumulative product")
    expect(page.locator("#race .lane-count").first).to_contain_text("tokens", timeout=30_000)
    # by default a few uncommitted drafts per cycle (rejected, or unverified under the verify
    # threshold), the rest counted; the toggle shows them all
    uncommitted = page.locator("#dflash-tokens .tok-rejected, #dflash-tokens .tok-unverified")
    shown = uncommitted.count()
    assert page.locator("#dflash-tokens .tok-more").count() > 0
    page.locator("#all-rejected input").check()
    expect(page.locator("#dflash-tokens .tok-more")).to_have_count(0)
    assert uncommitted.count() > shown
    page.locator("#all-rejected input").uncheck()
    expect(uncommitted).to_have_count(shown)
    dark = page.evaluate("document.body.classList.contains('dark')")
    page.locator("#theme-toggle").click()
    assert page.evaluate("document.body.classList.contains('dark')") != dark
    page.locator("#theme-toggle").click()
    ARTIFACTS.mkdir(exist_ok=True)
    page.wait_for_timeout(1500)  # let the race replay draw for the screenshot
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)


def test_query_parameters_prefill_the_form(served, page):
    text = "class Queue:\n    <b>'quoted'</b>"
    page.goto(f"{served[0]}?prompt={quote(text)}&max_tokens=17&block_size=5&chat=0&min_confidence=0.35")
    expect(page.locator("#prompt textarea")).to_have_value(text, timeout=30_000)
    expect(page.locator("#max-tokens input[type=number]")).to_have_value("17")
    expect(page.locator("#block-size input[type=number]")).to_have_value("5")
    expect(page.locator("#min-confidence input[type=number]")).to_have_value("0.35")
    page.locator("#copy-link").click()
    expect(page.locator("#permalink textarea, #permalink input")).to_have_value(
        f"{served[0]}?prompt={quote(text, safe='')}&max_tokens=17&block_size=5&chat=0&min_confidence=0.35".replace(
            "%20", "+"
        )
    )
