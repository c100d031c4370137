import pytest
from streamlit import config
from streamlit.testing.v1 import AppTest

from workbench.runs import RunStore


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh workbench home, no password, the app on 127.0.0.1 (as `make app` serves it)."""
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("WORKBENCH_PASSWORD", raising=False)
    old = config.get_option("server.address")
    config.set_option("server.address", "127.0.0.1")
    yield tmp_path
    config.set_option("server.address", old)


@pytest.fixture
def store(home):
    return RunStore()


def page(module: str) -> AppTest:
    """One page of the app rendered on its own (its wiring: widgets -> store / figures)."""
    return AppTest.from_string(f"from workbench.ui import {module}\n{module}.render()\n", default_timeout=60)
