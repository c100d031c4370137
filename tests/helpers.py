"""Small assertion helpers shared by the tests."""

import tempfile
from pathlib import Path

import torch


def assert_values(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """Compare a tensor with hand-written (possibly nested) numbers."""
    expected_t = (expected.detach() if isinstance(expected, torch.Tensor) else torch.tensor(expected, dtype=torch.float64)).to(torch.float64)
    torch.testing.assert_close(actual.detach().to(torch.float64), expected_t, atol=atol, rtol=0)


def home_with_tiny_model(home, tiny_model_dir):
    """Make ``home`` a workbench home holding a copy of the session's tiny-model build."""
    import shutil
    from pathlib import Path

    home = Path(home)
    shutil.copytree(tiny_model_dir, home / "models" / tiny_model_dir.name)
    return home


def missing_component(reason: str) -> None:
    """A system component a test needs is missing: fail under CI (CI=true/1), skip elsewhere."""
    import os

    import pytest

    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(reason)
    pytest.skip(reason)


APT_LOCK = Path(tempfile.gettempdir()) / "workbench-tests-apt.lock"


def apt_install(packages: list[str], installed) -> str | None:
    """Install Debian ``packages`` with apt-get (as root, or through ``sudo -n``) unless
    ``installed()`` already holds; None when it holds afterwards, else why not (for
    ``missing_component``). One install at a time across test processes (``make test`` runs two
    partitions side by side): a file lock here, and apt's own lock waited for, not failed on.
    A failed install refreshes the package lists once and tries again (stale lists)."""
    import fcntl
    import os
    import shutil
    import subprocess

    if installed():
        return None
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None or shutil.which("apt-get") is None:
        return f"{' '.join(packages)} missing, and this machine cannot apt-get install them (needs root or sudo, and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait_for_apt = ["-o", "DPkg::Lock::Timeout=900"]
    install = [*sudo, "apt-get", *wait_for_apt, "install", "-y", "--no-install-recommends", *packages]
    with APT_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed():  # the other partition installed them while this one waited
            return None
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            subprocess.run([*sudo, "apt-get", *wait_for_apt, "update"], env=env, capture_output=True, timeout=900)
            done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    if installed():
        return None
    return f"apt-get install {' '.join(packages)} failed: {done.stderr[-1000:]}"


def live_processes() -> dict[int, dict]:
    """Every live (non-zombie) process, read from /proc independently of the code under test:
    {pid: {"ppid", "pgid", "start", "cmdline"}}."""
    from pathlib import Path

    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            table[int(entry.name)] = {"ppid": int(fields[1]), "pgid": int(fields[2]), "start": fields[19], "cmdline": cmdline}
    return table
