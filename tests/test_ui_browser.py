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
    # the fixed policy drafts every cycle (the adaptive one's plain steps: the test after the next)
    expect(page.locator("#min-confidence input[type=number]")).to_be_disabled()
    page.locator("#policy label", has_text="fixed").click()
    expect(page.locator("#min-confidence input[type=number]")).to_be_enabled()
    page.locator("#run").click()
    expect(page.locator("#lossless")).to_contain_text("identical", timeout=120_000)
    assert page.locator("#dflash-tokens .plain-step").count() == 0
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
    # a link from before the policy: its min_confidence means the fixed policy
    page.goto(f"{served[0]}?prompt={quote(text)}&max_tokens=17&block_size=5&chat=0&min_confidence=0.35")
    expect(page.locator("#prompt textarea")).to_have_value(text, timeout=30_000)
    expect(page.locator("#max-tokens input[type=number]")).to_have_value("17")
    expect(page.locator("#block-size input[type=number]")).to_have_value("5")
    expect(page.locator("#min-confidence input[type=number]")).to_have_value("0.35")
    expect(page.locator("#policy input[value=fixed]")).to_be_checked()
    expect(page.locator("#min-confidence input[type=number]")).to_be_enabled()
    page.locator("#copy-link").click()
    prompt = quote(text, safe="").replace("%20", "+")
    link = page.locator("#permalink textarea, #permalink input")
    expect(link).to_have_value(
        f"{served[0]}?prompt={prompt}&max_tokens=17&block_size=5&chat=0&policy=fixed&min_confidence=0.35"
    )
    # the adaptive policy's link has no threshold, and its page no threshold to set
    page.goto(f"{served[0]}?prompt={quote(text)}&max_tokens=17&block_size=5&chat=0&policy=adaptive")
    expect(page.locator("#prompt textarea")).to_have_value(text, timeout=30_000)  # the link has filled the form
    expect(page.locator("#max-tokens input[type=number]")).to_have_value("17")
    expect(page.locator("#policy input[value=adaptive]")).to_be_checked()
    expect(page.locator("#min-confidence input[type=number]")).to_be_disabled()
    page.locator("#copy-link").click()
    expect(link).to_have_value(f"{served[0]}?prompt={prompt}&max_tokens=17&block_size=5&chat=0&policy=adaptive")


def test_the_adaptive_policys_plain_steps_show_on_the_page(served, page):
    """The page's default policy: its plain steps are outlined in the DFlash pane, as many as
    the stats say, each with its reason on hover, and the inspector explains one."""
    page.goto(served[0])
    page.locator("#prompt textarea").fill(PROMPT)
    page.locator("#max-tokens input[type=number]").fill(str(MAX_TOKENS))
    page.locator("#max-tokens input[type=number]").press("Enter")
    expect(page.locator("#policy input[value=adaptive]")).to_be_checked()
    page.locator("#run").click()
    expect(page.locator("#lossless")).to_contain_text("identical", timeout=120_000)
    stat = page.locator("#dflash-stats .stat", has=page.locator(".k", has_text="plain steps")).locator(".v")
    plain, cycles = (int(n) for n in stat.inner_text().split(" of "))
    steps = page.locator("#dflash-tokens .cycle.plain-step")
    assert steps.count() == plain and 0 <= plain <= cycles
    expect(page.locator("#status-panel")).to_contain_text(f"adaptive policy: {plain} plain step")
    if plain:  # the policy stepped plainly on this machine: inspect one
        assert steps.first.get_attribute("title").startswith("plain step: ")
        index = steps.first.get_attribute("data-cycle")
        page.locator("#cycle-slider input[type=number]").fill(index)
        page.locator("#cycle-slider input[type=number]").press("Enter")
        expect(page.locator("#inspector")).to_contain_text(f"Cycle {index} · plain step")
        expect(page.locator("#inspector")).to_contain_text("no draft forward was run")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "playground-plain-steps.png"), full_page=True)
