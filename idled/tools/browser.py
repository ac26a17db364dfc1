"""A headless Chromium driven by Selenium, for the status page's test and benchmark.

The browser and its driver are the system's (Debian's ``chromium`` and ``chromium-driver``, installed by
``.ci/system-deps``), found on PATH and handed to Selenium explicitly, so Selenium Manager never tries to
download a browser or a driver. Selenium is the ``test`` extra's and imported only here, when a browser is
asked for. The flags make Chromium start quickly and quietly in a container: no sandbox (root in CI), no GPU,
no /dev/shm (often 64 MiB in containers), nothing fetched in the background, a throw-away profile. Browser
console messages are kept (``goog:loggingPrefs``) for ``driver.get_log("browser")``.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BrowserUnavailable", "CHROMIUM_FLAGS", "start_chromium"]

CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
    "--disable-default-apps", "--mute-audio",
)


class BrowserUnavailable(RuntimeError):
    """No headless Chromium here: the reason says what is missing or why it did not start."""


def start_chromium(profile: Path, *, width: int = 1280, height: int = 1500, flags: Sequence[str] = ()) -> Any:
    """A ``selenium.webdriver.Chrome`` on the system's chromium and chromedriver, with a profile in ``profile``
    (``flags``: more command-line switches)."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        raise BrowserUnavailable(f"selenium is not installed ({exc}): pip install -e '.[test]'") from None
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        missing = " and ".join(name for name, path in (("chromium", binary), ("chromedriver", driver)) if path is None)
        raise BrowserUnavailable(f"{missing} not on PATH (Debian: chromium, chromium-driver; see .ci/system-deps)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, *flags, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        return webdriver.Chrome(service=Service(executable_path=driver), options=options)
    except WebDriverException as exc:
        raise BrowserUnavailable(f"chromium did not start: {exc.msg or exc}") from None
