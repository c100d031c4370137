"""The app's server does not watch files, however it is started (`make app`, the Procfile): the
default watcher walks the project folder including .venv and run directories, overflows inotify
and burns a core. .streamlit/config.toml is read only from the current folder, so each command
line must say --server.fileWatcherType none itself. Checked on the running server: the inotify
watches its process holds (/proc/PID/fdinfo) once a browser session has rendered the app."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, free_port, wait_healthy
from tests.ui.test_server import procfile_command


def inotify_watches(pid: int) -> int:
    """Inotify watches held by process ``pid`` (one 'inotify wd:' line per watch in its fdinfo)."""
    total = 0
    for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            total += fd.read_text().count("inotify wd:")
        except OSError:  # an fd closed while we read
            pass
    return total


def make_app_command() -> str:
    """The command `make app` runs (make -n prints it without running it)."""
    out = subprocess.run(["make", "-s", "-n", "app", "PORT=$$PORT"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if "streamlit run" in line)


def watches_after_first_render(command: str, chromium: str, home: Path) -> int:
    """Start ``command`` (a shell line using $PORT) from the project folder, render the app in
    chromium, and return the server's inotify watches at that moment."""
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=ROOT, start_new_session=True,
                            env={**os.environ, "PORT": str(port), "WORKBENCH_HOME": str(home)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            page.goto(url)
            page.get_by_role("button", name="Launch run").wait_for(timeout=60_000)
            watches = inotify_watches(proc.pid)
            browser.close()
        return watches
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_probe_sees_the_default_watcher(chromium, tmp_path):
    """Control: the same server with the watcher explicitly on holds inotify watches at that point."""
    command = procfile_command().replace("--server.fileWatcherType=none", "--server.fileWatcherType=auto")
    assert watches_after_first_render(command, chromium, tmp_path) > 0


@pytest.mark.parametrize("source", ["Procfile", "make app"])
def test_server_command_lines_watch_no_files(source, chromium, tmp_path):
    command = procfile_command() if source == "Procfile" else make_app_command()
    assert "fileWatcherType" in command and "none" in command.split("fileWatcherType", 1)[1][:6], command
    assert watches_after_first_render(command, chromium, tmp_path) == 0
