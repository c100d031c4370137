"""`make app` / the Procfile for real: `streamlit run app.py` headless answers its health check
and serves the page (real subprocesses)."""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(port: int, timeout_s: float = 60) -> str | None:
    """The body of /_stcore/health once the server answers (None if it never does)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read().decode()
        except OSError:
            time.sleep(0.3)
    return None


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=20)


def test_streamlit_server_answers_health(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, env={**os.environ, "WORKBENCH_HOME": str(tmp_path)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        assert health(port) == "ok"
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
        assert "<title>Streamlit</title>" in page or "<div id=\"root\">" in page
    finally:
        stop(proc)


def procfile_command(process_type: str = "web") -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() == process_type:
            return command.strip()
    raise AssertionError(f"Procfile has no {process_type!r} process")


def test_procfile_web_command_serves_the_app(tmp_path):
    """The Procfile's web line as a platform runs it: through a shell, with $PORT set."""
    port = free_port()
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {procfile_command()}"], cwd=ROOT,
        env={**os.environ, "PORT": str(port), "WORKBENCH_HOME": str(tmp_path)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        assert health(port) == "ok"
    finally:
        stop(proc)
