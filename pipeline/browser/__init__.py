"""The kernel in a real browser: page.html runs it on the browser's own
WebGPU (`navigator.gpu`), fed from Python through a headless Chromium driven over the
DevTools protocol (chromium.py). tests/test_browser.py holds its results to float64."""

from pipeline.browser.chromium import BrowserError, Chromium, find_chromium
from pipeline.browser.page import BrowserKernel, Launch, Outcome, open_browser_kernel

__all__ = ["BrowserError", "BrowserKernel", "Chromium", "Launch", "Outcome", "find_chromium", "open_browser_kernel"]
