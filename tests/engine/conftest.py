import json
import pytest

from tests.helpers import home_with_tiny_model


@pytest.fixture(scope="session")
def wb_home(tmp_path_factory, tiny_model_dir):
    """One workbench home for the engine tests, holding the session's tiny-model build."""
    home = home_with_tiny_model(tmp_path_factory.mktemp("wbhome"), tiny_model_dir)
    mp = pytest.MonkeyPatch()
    mp.setenv("WORKBENCH_HOME", str(home))
    yield home
    mp.undo()


@pytest.fixture(scope="session")
def few_problems(wb_home):
    """Four arithmetic problems: a tiny model visibly learns them within ~30 steps on a CPU."""
    path = wb_home / "four_problems.jsonl"
    rows = [{"prompt": "3+2=", "answer": "5"}, {"prompt": "7-4=", "answer": "3"},
            {"prompt": "6+1=", "answer": "7"}, {"prompt": "9-5=", "answer": "4"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
