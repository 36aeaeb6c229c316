"""The playground opened in headless Chromium through Playwright, for the browser tests, the
screenshot script (scripts/playground_screenshots.py) and the page-vs-headless benchmark
(scripts/page_vs_headless.py). One launcher, so that all three see the page the same way.

The browser is the system's Chromium (Debian's package, which scripts/install.sh installs), not
one that Playwright downloads."""

CHROMIUM = "/usr/bin/chromium"

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # the sandbox cannot start as root or inside most containers
    "--disable-gpu",  # software rendering: the machines have no GPU for Chromium to use
    # nothing but the local page on the network, and no first-run dialogs: quiet, repeatable runs
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright):
    """A headless Chromium browser from a started Playwright (sync API); the caller closes it."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
