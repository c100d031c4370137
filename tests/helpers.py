"""Small assertion helpers shared by the tests."""

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
