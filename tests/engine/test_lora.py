"""LoRA through PEFT, gradient checkpointing and bf16 on the tiny model (issue 12 section 6).

What is proven, with real PEFT, transformers and accelerate on the CPU:
- a LoRA run trains the adapters only: the optimiser holds exactly the adapter tensors, the base
  weights end bit-identical to the model on disk, and the adapters moved;
- its reference log-probs are the base model's, exactly (fp32, torch.equal), from the policy
  itself with its adapters disabled: no second model exists in the process;
- the merged weights (vLLM's and final/'s) are W + (B @ A) * alpha / r, computed by hand here;
- checkpoints hold the adapters, and a resume from one equals the uninterrupted run exactly;
  final/ loads with AutoModelForCausalLM (no PEFT) and computes what the trained policy does;
  final_adapter/ loads with PeftModel.from_pretrained onto the base;
- train.staleness samples with the adapters of k updates ago, swapped into the policy for the
  generation (one base in memory, the trained adapters back after it); PPO's critic trains beside LoRA;
- vLLM samples from the merged weights: its log-probs equal the LoRA policy's after updates;
- gradient checkpointing recomputes each layer (its forward runs twice per step) and leaves the
  loss and gradients as they were (fp32, measured bit-identical; asserted to 1e-6);
- bf16 mixed precision runs on the CPU with finite metrics.
"""

import gc
import json
import math
import shutil
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationMixin, PreTrainedModel

from tests.engine.test_checkpoint import _train
from tests.engine.test_trainer import metrics_of
from workbench.engine.checkpoint import FINAL_ADAPTER_DIR, FINAL_DIR, checkpoint_dir
from workbench.engine.events import EVENTS_FILE
from workbench.engine.forward import logprobs_and_entropy
from workbench.engine.models import (adapter_state_dict, adapters_swapped, apply_lora, is_lora, load_policy,
                                     load_policy_state, merged_state_dict, prepare_policy, trainable_parameters)
from workbench.engine.trainer import Trainer, parameter_digest
from workbench.recipe import Lora, load_recipe

LORA = ["lora.r=4", "lora.alpha=8"]
FP32_LOGPROB_BOUND = 1e-4  # vLLM vs trainer, same weights, fp32 (test_vllm's bound)


def _recipe(few_problems, *extra):
    return load_recipe("grpo", [f"dataset={few_problems}", "train.steps=4", "optim.lr=0.01", "logging.samples_per_step=0",
                                "logging.diagnostics_every=0", *LORA, *extra])


def _live_models() -> int:
    """Causal LMs alive in this process (their decoders, also PreTrainedModels, not counted)."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance on torch's deprecated module attributes warns
        warnings.simplefilter("ignore")
        return sum(isinstance(o, PreTrainedModel) and isinstance(o, GenerationMixin) for o in gc.get_objects())


def test_lora_trains_adapters_only_and_its_reference_is_the_base_exactly(wb_home, few_problems, tmp_path):
    """GRPO with KL (kl_coef 0.04): four steps at lr 0.01 move the adapters; then on a fresh batch
    the trainer's reference log-probs equal a freshly loaded base model's bit for bit, while the
    policy's differ. One PreTrainedModel in the process: the reference is no copy."""
    recipe = _recipe(few_problems)
    assert recipe.algorithm.uses_reference
    before = _live_models()
    trainer = Trainer(recipe, tmp_path)
    trainer.setup()
    assert _live_models() - before == 1  # the policy only (no reference, no behaviour copy)
    policy = trainer.accelerator.unwrap_model(trainer.policy)
    assert is_lora(policy)
    optimised = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    adapters = adapter_state_dict(policy)
    assert len(optimised) == len(adapters) == 4 * 7 * 2  # 4 layers x 7 linear layers x (A, B)
    assert sum(p.numel() for p in optimised) == 4 * 4 * (4 * 256 + 3 * 480)  # r (in + out) per layer: 39,424
    for s in range(4):
        trainer.step(s)
    assert all(float(v.abs().max()) > 0 for k, v in adapter_state_dict(policy).items() if "lora_B" in k)  # B starts at 0

    base, _ = load_policy("tiny")
    assert parameter_digest(base) == parameter_digest(_base_view(policy))  # frozen: bit-identical
    _, out = trainer.rollout(4)
    with torch.no_grad():
        ref = logprobs_and_entropy(trainer.reference, out, 1.0, with_entropy=False)[0]
        expected = logprobs_and_entropy(base, out, 1.0, with_entropy=False)[0]
        trained = logprobs_and_entropy(trainer.policy, out, 1.0, with_entropy=False)[0]
    assert torch.equal(ref, expected)
    assert float(((trained - expected).abs() * out.completion_mask).max()) > 1e-3  # the adapters matter


def _base_view(peft_model):
    """The base weights of a PEFT model under the base's names, adapters left out (not merged)."""
    base, _ = load_policy("tiny")
    state = {k.replace(".base_layer.", "."): v for k, v in peft_model.get_base_model().state_dict().items() if ".lora_" not in k}
    base.load_state_dict(state)
    return base


def test_merged_weights_are_base_plus_scaled_low_rank_product(wb_home):
    """W' = W + (B @ A) * alpha / r, by hand, for every adapted layer; everything else is the base's,
    under the base model's names (what vLLM's loader and from_pretrained expect)."""
    torch.manual_seed(0)
    base, _ = load_policy("tiny")
    names = set(base.state_dict())
    original = {k: v.clone() for k, v in base.state_dict().items()}
    model = apply_lora(base, Lora(r=2, alpha=6.0, target_modules=["q_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_()
    merged = merged_state_dict(model)
    assert set(merged) == names
    modules = dict(model.get_base_model().named_modules())
    adapted = 0
    for name, value in merged.items():
        module = modules.get(name.removesuffix(".weight"))
        if name.endswith(("q_proj.weight", "down_proj.weight")):
            A, B = module.lora_A["default"].weight, module.lora_B["default"].weight
            torch.testing.assert_close(value, original[name] + (B @ A) * (6.0 / 2), atol=0, rtol=0)
            adapted += 1
        else:
            assert torch.equal(value, original[name]), name
    assert adapted == 4 * 2


def test_checkpoint_holds_adapters_resume_is_exact_and_final_loads_without_peft(wb_home, few_problems, tmp_path):
    """Run A: 4 steps, a checkpoint every 2 (mu 2, so the optimiser state matters). Run B starts
    from A's recipe and A's step-1 checkpoint alone (what a crash after it leaves) and resumes:
    its final weights and its steps 2-3 equal A's exactly (1 thread). final/ is a plain model
    computing what the trained policy computes; final_adapter/ loads onto the base with PEFT."""
    recipe = _recipe(few_problems, "train.mu=2", "checkpoint.every=2", "checkpoint.keep_last=2")
    a = tmp_path / "a"
    assert Trainer(recipe, a).run() == "finished"
    step1 = checkpoint_dir(a, 1)
    assert (step1 / "adapter_model.safetensors").is_file() and not (step1 / "model.safetensors").exists()

    b = tmp_path / "b"
    (b / "checkpoints").mkdir(parents=True)
    shutil.copytree(step1, checkpoint_dir(b, 1))
    lines = (a / EVENTS_FILE).read_text().splitlines(keepends=True)
    (b / EVENTS_FILE).write_text("".join(line for line in lines if json.loads(line)["step"] <= 1))
    assert Trainer(recipe, b, resume=True).run() == "finished"

    def by_step(run):
        return {m["step"]: {k: v for k, v in m.items() if not k.startswith("perf/")} for m in metrics_of(run)}

    assert by_step(b)[2] == by_step(a)[2] and by_step(b)[3] == by_step(a)[3]
    final_a = AutoModelForCausalLM.from_pretrained(a / FINAL_DIR)
    final_b = AutoModelForCausalLM.from_pretrained(b / FINAL_DIR)
    assert not is_lora(final_a) and parameter_digest(final_a) == parameter_digest(final_b)

    from peft import PeftModel

    with_adapter = PeftModel.from_pretrained(load_policy("tiny")[0], a / FINAL_ADAPTER_DIR)
    base, _ = load_policy("tiny")
    ids = torch.tensor([[3, 7, 9, 12, 5, 20]])
    with torch.no_grad():
        torch.testing.assert_close(final_a(input_ids=ids).logits, with_adapter(input_ids=ids).logits, atol=1e-5, rtol=0)
        assert float((final_a(input_ids=ids).logits - base(input_ids=ids).logits).abs().max()) > 1e-3


def test_staleness_keeps_one_base_in_memory(wb_home, few_problems, tmp_path):
    """LoRA + train.staleness=2: one causal LM in the process after set-up and after steps (the
    stale behaviour is a set of adapter values swapped into the policy, not a second base), and the
    policy holds one adapter only (PEFT's 'default')."""
    before = _live_models()
    trainer = Trainer(_recipe(few_problems, "train.staleness=2", "train.steps=2"), tmp_path)
    trainer.setup()
    assert _live_models() - before == 1
    trainer.step(0)
    assert _live_models() - before == 1
    policy = trainer.accelerator.unwrap_model(trainer.policy)
    assert list(policy.peft_config) == ["default"] and trainer.behaviour is None


def test_staleness_samples_with_the_adapters_of_k_updates_ago(wb_home, few_problems, tmp_path):
    """train.staleness=1, one update per step: the rollout of step s is exactly (token ids and
    log-probs, torch.equal) the rollout a staleness-0 trainer makes with the adapters of update
    max(0, s - 1) loaded; after each rollout the trained adapters are back bit for bit, still
    requiring grad and still the very tensors the optimiser holds; the snapshots hold adapters only."""
    stale = Trainer(_recipe(few_problems, "train.staleness=1"), tmp_path / "stale")
    stale.setup()
    fresh = Trainer(_recipe(few_problems), tmp_path / "fresh")  # samples with its own current adapters
    fresh.setup()
    policy = stale.accelerator.unwrap_model(stale.policy)
    optimised = [p for group in stale.optimizer.param_groups for p in group["params"]]
    history = [_adapters(policy)]  # after 0, 1, 2 updates
    for s in range(3):
        _, out = stale.rollout(s)
        assert _adapters(policy).keys() == history[-1].keys() == stale.snapshots[0].keys()
        assert all(torch.equal(v, history[-1][k]) for k, v in _adapters(policy).items())  # trained ones back
        assert all(p.requires_grad for p in optimised) and len(optimised) == len(history[-1])
        assert {id(p) for p in optimised} == {id(p) for p in trainable_parameters(stale.policy)}
        load_policy_state(fresh.accelerator.unwrap_model(fresh.policy), history[max(0, s - 1)])
        _, expected = fresh.rollout(s)
        assert torch.equal(out.completion_ids, expected.completion_ids) and torch.equal(out.rollout_logp, expected.rollout_logp)
        if s == 2:  # the current adapters would have sampled otherwise: the lag is visible
            load_policy_state(fresh.accelerator.unwrap_model(fresh.policy), history[2])
            assert not torch.equal(fresh.rollout(s)[1].rollout_logp, out.rollout_logp)
        stale.step(s)
        history.append(_adapters(policy))
    assert any(not torch.equal(history[1][k], history[2][k]) for k in history[1])


def test_two_processes_swap_stale_adapters_and_stay_in_sync(wb_home, few_problems, tmp_path):
    """accelerate launch, 2 CPU processes (DDP around the PEFT policy), LoRA + train.staleness=1,
    mu 2: the swap in and out of the DDP-wrapped parameters leaves both ranks' parameters identical."""
    from tests.engine.test_process import launch_two_processes

    run_dir = tmp_path / "ddp"
    sets = ["train.steps=3", f"dataset={few_problems}", "train.mu=2", "train.staleness=1", *LORA]
    res = launch_two_processes(wb_home, 29547, "grpo", *[x for s in sets for x in ("--set", s)], "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run_dir / "params.rank0.sha256").read_text() == (run_dir / "params.rank1.sha256").read_text()
    assert len(metrics_of(run_dir)) == 3


def _adapters(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in adapter_state_dict(model).items()}


def test_swapped_adapters_come_back_after_an_error(wb_home):
    """adapters_swapped: inside the block the model computes with the given adapters; after an
    exception in it the trained ones are back bit for bit, requires_grad as before."""
    torch.manual_seed(0)
    model = apply_lora(load_policy("tiny")[0], Lora(r=2, alpha=4.0))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_()
    trained = _adapters(model)
    zeros = {k: torch.zeros_like(v) for k, v in trained.items()}  # B = 0: the base's function
    ids = torch.tensor([[3, 7, 9, 12]])
    with torch.no_grad():
        base = model.get_base_model()
        with model.disable_adapter():
            expected = base(input_ids=ids).logits
        with pytest.raises(RuntimeError, match="inside"):
            with adapters_swapped(model, zeros):
                assert torch.equal(model(input_ids=ids).logits, expected)
                raise RuntimeError("inside")
    assert all(torch.equal(v, trained[k]) for k, v in adapter_state_dict(model).items())
    assert [n for n, p in model.named_parameters() if p.requires_grad] == list(trained)


def test_ppo_critic_trains_beside_lora(wb_home, few_problems, tmp_path):
    """PPO (critic, GAE, KL in the reward) with LoRA: the critic is a copy of the policy's adapted
    backbone plus a value head; its adapters and head train, its base stays frozen."""
    recipe = load_recipe("ppo", [f"dataset={few_problems}", "train.steps=2", *LORA, "logging.diagnostics_every=0"])
    trainer = Trainer(recipe, tmp_path)
    trainer.setup()
    critic = trainer.accelerator.unwrap_model(trainer.critic)
    frozen = {k: v.clone() for k, v in critic.state_dict().items() if ".base_layer." in k}
    assert frozen
    ms = [trainer.step(s) for s in range(2)]
    assert all(math.isfinite(m["loss/value"]) for m in ms)
    assert all(torch.equal(critic.state_dict()[k], v) for k, v in frozen.items())
    assert float(critic.head.weight.detach().abs().max()) > 0


def test_gradient_checkpointing_recomputes_and_keeps_loss_and_grads(wb_home):
    """The same batch through prepare_policy with and without train.gradient_checkpointing (full
    fine-tuning and LoRA): each decoder layer's MLP forward runs twice with it (the recompute) and
    once without; loss and every gradient agree to 1e-6 (fp32; measured bit-identical)."""
    ids = torch.tensor([[3, 7, 9, 12, 5, 20, 8, 4], [6, 6, 2, 9, 11, 30, 17, 5]])
    for lora in (Lora(), Lora(r=4, alpha=8.0)):
        results = []
        for checkpointing in (False, True):
            torch.manual_seed(0)
            model = prepare_policy(load_policy("tiny")[0], lora, checkpointing)
            calls = []  # counted in forward itself: module hooks do not fire in the recompute
            mlp = model.get_decoder().layers[0].mlp
            mlp.forward = lambda *a, _f=mlp.forward, **k: (calls.append(1), _f(*a, **k))[1]
            logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1)
            loss = -logp.gather(-1, ids[:, 1:, None]).mean()
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
            results.append((loss.detach(), grads, len(calls)))
        (loss0, g0, calls0), (loss1, g1, calls1) = results
        assert (calls0, calls1) == (1, 2)
        torch.testing.assert_close(loss1, loss0, atol=1e-6, rtol=0)
        assert g0.keys() == g1.keys() and len(g0) == (len(trainable_parameters(model)))
        for name in g0:
            torch.testing.assert_close(g1[name], g0[name], atol=1e-6, rtol=0)


@pytest.mark.parametrize("extra", [[], LORA], ids=["full", "lora"])
def test_bf16_on_cpu_finishes_with_finite_metrics(wb_home, few_problems, tmp_path, extra):
    """train.precision=bf16 on the CPU (accelerate's bf16 autocast), gradient checkpointing on, as
    `python -m workbench train` runs it (a process of its own: accelerate's state is per process)."""
    sets = [f"dataset={few_problems}", "train.steps=2", "train.precision=bf16", "train.gradient_checkpointing=true", *extra]
    done = _train(wb_home, "grpo", *[a for s in sets for a in ("--set", s)], "--run-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    ms = metrics_of(tmp_path)
    assert len(ms) == 2
    for m in ms:
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
    assert ms[-1]["kl"] >= 0


def test_vllm_samples_from_the_merged_lora_weights(wb_home, few_problems, tmp_path):
    """train.rollout=vllm with LoRA: after updates that moved the adapters, vLLM's log-probs (of
    the merged weights synced in) equal the LoRA policy's within the fp32 bound, every step."""
    trainer = Trainer(_recipe(few_problems, "train.rollout=vllm"), tmp_path)
    trainer.setup()
    try:
        ms = [trainer.step(s) for s in range(3)]
        for m in ms:
            assert m["sampling/sampling_logp_difference/max"] < FP32_LOGPROB_BOUND, m
        _, out = trainer.rollout(3)
        base, _ = load_policy("tiny")
        with torch.no_grad():
            now = logprobs_and_entropy(trainer.policy, out, 1.0, with_entropy=False)[0]
            before = logprobs_and_entropy(base, out, 1.0, with_entropy=False)[0]
        mask = out.completion_mask
        assert float(((out.rollout_logp - now).abs() * mask).max()) < FP32_LOGPROB_BOUND
        assert float(((out.rollout_logp - before).abs() * mask).max()) > 100 * FP32_LOGPROB_BOUND
    finally:
        trainer.rollout_backend.close()


def test_parameter_count_from_config_matches_the_tiny_model(wb_home):
    """The torch-free count (model_facts, from config.json) equals the loaded tiny model's own:
    816,768 (4 x (4 x 128 x 128 + 3 x 128 x 352 + 2 x 128) + 100 x 128 + 128, tied head)."""
    from workbench.engine.models import resolve_model
    from workbench.model_facts import model_facts

    model, _ = load_policy("tiny")
    shape = model_facts(resolve_model("tiny")).shape
    assert shape.num_parameters == sum(p.numel() for p in model.parameters()) == 816_768
    assert shape.lora_parameters(4, "all-linear") == sum(p.numel() for p in trainable_parameters(apply_lora(model, Lora(r=4))))
