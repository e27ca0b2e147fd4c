"""A headless Chromium for pictures of seqae's pages (the documentation's screenshots, the browser
tests): Debian's chromium and chromium-driver, driven by Selenium (the ``test`` and ``docs`` extras)."""

from __future__ import annotations

import shutil
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def headless_chromium(width: int = 1400, height: int = 1100) -> Any:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        raise RuntimeError(
            "Debian's chromium and chromium-driver are needed (apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)
