"""A real browser (Debian's chromium, driven by Playwright) against `streamlit run app.py`.

Never lets Playwright download a browser: the system chromium is used by path. If it is missing
the fixture installs it with apt-get (root or sudo); where that is impossible the test fails under
CI=true and is skipped elsewhere (with the reason).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.wire_log import WireLog
from tests.helpers import apt_install, home_with_tiny_model, missing_component

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "e2e-s3cret"


def _install_chromium() -> str | None:
    """apt-get install chromium when we can; returns why not, or None when it is there."""
    return apt_install(["chromium"], lambda: Path(CHROMIUM).exists())


@pytest.fixture(scope="session")
def chromium() -> str:
    problem = _install_chromium()
    if problem:
        missing_component(problem)
    return CHROMIUM


def sign_in(page, name: str = "erin", password: str = PASSWORD) -> None:
    """Sign in through the sidebar's form (the page must show it) and wait for the app to say so."""
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_label("Your name (recorded as the owner of your runs)").fill(name)
    sidebar.get_by_label("Password", exact=True).fill(password)
    sidebar.get_by_role("button", name="Sign in").click()
    page.get_by_text("Signed in as").wait_for()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def e2e_home(tmp_path_factory, tiny_model_dir):
    """A temp workbench home with the tiny model already built (both runs then start at once)."""
    return home_with_tiny_model(tmp_path_factory.mktemp("e2ehome"), tiny_model_dir)


# What `make app` and the Procfile pass too (.streamlit/config.toml is only read from the cwd).
SERVER_FLAGS = ["--server.headless", "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
                "--server.fileWatcherType", "none"]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60, log: Path | None = None) -> None:
    """Return once ``url``/_stcore/health answers ok; fail (server stopped, log tail shown) otherwise."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    pytest.fail(f"streamlit did not answer its health check; log: {log.read_text()[-2000:] if log else '(none)'}")


@pytest.fixture(scope="session")
def server(e2e_home):
    """`streamlit run app.py` headless on 127.0.0.1 with a password set; yields its URL."""
    port = free_port()
    env = {**os.environ, "WORKBENCH_HOME": str(e2e_home), "WORKBENCH_PASSWORD": PASSWORD, "OMP_NUM_THREADS": "1"}
    log = open(e2e_home / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", *SERVER_FLAGS, "--server.port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log=e2e_home / "server.log")
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture
def screenshots(tmp_path) -> Path:
    """Where the browser tests save screenshots: a temporary folder, or the folder named by
    WB_SCREENSHOTS (`make screenshots` sets docs/ to refresh the README's pictures)."""
    folder = Path(os.environ.get("WB_SCREENSHOTS") or tmp_path / "screenshots")
    folder = folder if folder.is_absolute() else ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser_page(chromium, server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        page.set_default_timeout(180_000)  # a liveness bound on a machine shared with the other test partition
        page.wire = WireLog(page)  # the websocket's exchanges, for a failure's message
        yield page
        browser.close()
