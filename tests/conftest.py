"""Fixtures shared by every test package: one tiny-model build per session, copied into fresh homes."""

import os

import pytest
from hypothesis import settings

from tests.helpers import home_with_tiny_model

# Hypothesis: under CI (the env var CI set to anything, as CI services and `CI=true make test` do;
# hypothesis uses the same rule) every run draws the same examples (derandomize), so a red build is
# reproducible and a green one is not a lucky draw; local runs keep exploring new examples each
# time (failures are replayed from .hypothesis/). Both profiles are explicit, not left to the
# installed hypothesis's defaults.
settings.register_profile("ci", settings.get_profile("default"), derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", settings.get_profile("default"), derandomize=False)
settings.load_profile("ci" if "CI" in os.environ else "dev")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The built-in tiny model, built once per test session (~20 s) in its own home."""
    from workbench.engine.tiny import ensure_tiny_model

    return ensure_tiny_model(tmp_path_factory.mktemp("tinyhome"))


@pytest.fixture
def fresh_home(tmp_path, monkeypatch, tiny_model_dir):
    """An empty workbench home (WORKBENCH_HOME) that already holds the built tiny model."""
    home = home_with_tiny_model(tmp_path / "home", tiny_model_dir)
    monkeypatch.setenv("WORKBENCH_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real SLURM cluster (munged, slurmctld, two slurmd on this machine), started once per
    session when a test asks for it and stopped at the end (tests/slurm_cluster.py)."""
    from tests.slurm_cluster import start_cluster

    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def slurm_accounting_cluster():
    """A second real SLURM cluster, one node, with accounting (MariaDB + slurmdbd) and MinJobAge = 2 s:
    the controller forgets a finished job within seconds and only ``sacct`` knows how it ended."""
    from tests.slurm_cluster import start_cluster

    cluster = start_cluster(accounting=True, node_count=1, min_job_age=2)
    yield cluster
    cluster.stop()
