"""``make test`` runs the suite as two partitions side by side (see the Makefile): every test file
belongs to exactly one, and each system component the tests start belongs to one partition only
(two SLURM clusters or two PostgreSQL installs racing would be a test bug, not a product one)."""
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the module or fixture that starts a component -> its name
COMPONENTS = {"slurm_cluster": "SLURM", "tests.runs.postgres": "PostgreSQL", "tests.runs.sshd": "sshd",
              "tests.runs.rayhead": "Ray", "mlflow_server": "MLflow"}


def partitions() -> list[list[str]]:
    """The entries (folders or files) of each partition, as ``make test-partitions`` prints them."""
    out = subprocess.run(["make", "-s", "test-partitions"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines() if line.strip()]


def files_of(entry: str) -> list[Path]:
    path = REPO / entry
    return sorted(path.rglob("test_*.py")) if path.is_dir() else [path]


def test_every_test_file_is_in_exactly_one_partition():
    parts = partitions()
    assert len(parts) == 2
    covered = [f for part in parts for entry in part for f in files_of(entry)]
    assert sorted(covered) == sorted((REPO / "tests").rglob("test_*.py"))
    assert len(covered) == len(set(covered))


def test_each_component_is_started_by_one_partition_only():
    users: dict[str, set[int]] = {}
    for index, part in enumerate(partitions()):
        for entry in part:
            path = REPO / entry
            modules = [*files_of(entry), *(path.rglob("conftest.py") if path.is_dir() else [])]
            for module in (m for m in modules if m != Path(__file__).resolve()):
                text = module.read_text()
                for marker, component in COMPONENTS.items():
                    if marker in text:
                        users.setdefault(component, set()).add(index)
    assert {"SLURM", "PostgreSQL", "sshd", "Ray", "MLflow"} <= set(users)
    assert all(len(parts) == 1 for parts in users.values()), users
