"""The algorithm specs (workbench.algorithms): one per registered function, and what derives from them."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.algorithms import FAMILIES, inert_knobs, resolve
from workbench.algorithms.policy_losses import KNOBS as POLICY_LOSS_KNOBS
from workbench.recipe import Algorithm, Recipe, load_recipe, preset_names

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "data" / "recipe_schema.json"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_registered_function_has_exactly_one_spec_and_it_names_the_function(family):
    f = FAMILIES[family]
    registry = resolve(f.registry)  # the core registry (torch): only this test imports it
    assert tuple(f.specs) == registry.names()  # same names, same order, none twice (by_name refuses)
    for name, s in f.specs.items():
        assert (s.family, s.name) == (family, name)
        assert resolve(s.implementation) is registry.get(name), name
        for helper in s.helpers + tuple(h for w in s.walkthroughs for h in w.helpers):
            assert callable(resolve(helper)), helper


def test_policy_loss_config_fields_are_the_policy_loss_knobs():
    from workbench.core.choices import PolicyLossConfig

    fields = dataclasses.fields(PolicyLossConfig)
    assert [f.name for f in fields] == list(POLICY_LOSS_KNOBS)
    assert {f.name: f.default for f in fields} == {k: knob.default for k, knob in POLICY_LOSS_KNOBS.items()}
    assert all(k.field == f"algorithm.{name}" for name, k in POLICY_LOSS_KNOBS.items())


def test_each_spec_lists_every_config_field_its_function_reads():
    """The knobs a spec lists include the ``cfg.<field>`` its function's own source reads."""
    from workbench.core import AdvantageConfig, PolicyLossConfig
    from workbench.core.distillation import DistillationConfig
    from workbench.viz.lab_estimators import knobs_read

    for family, config in (("advantage", AdvantageConfig), ("policy_loss", PolicyLossConfig), ("shaping", DistillationConfig)):
        for name, s in FAMILIES[family].specs.items():
            assert set(knobs_read(resolve(s.implementation), config)) <= set(s.knob_names), (family, name)


def _field_table() -> list[dict]:
    return [{"name": name, "annotation": str(f.annotation), "default": f.default, "bounds": [repr(m) for m in f.metadata],
             "description": f.description} for name, f in Algorithm.model_fields.items()]


def test_the_schema_and_every_preset_dump_as_before_the_specs():
    """The recipe's algorithm fields (order, types, defaults, bounds, help), its JSON schema and every
    preset's YAML are what 3c55296 (before the generated fields) produced, byte for byte, plus the
    fields added since: the five knobs of vespo and dro and the four of the KL controller and bypass
    mode (kl_controller, kl_target, kl_horizon, bypass_mode; checked, when they were added, to change
    nothing else), and the help of the four name fields, now written from the specs. A deliberate
    new field: regenerate the snapshot and review its diff."""
    expected = json.loads(SNAPSHOT.read_text())
    assert _field_table() == expected["algorithm_fields"]
    assert json.loads(json.dumps(Algorithm.model_json_schema())) == expected["algorithm_schema"]
    assert {n: load_recipe(n).to_yaml() for n in preset_names()} == expected["presets"]


def test_the_help_of_each_name_field_lists_every_spec_of_its_family():
    for family in ("advantage", "policy_loss", "aggregation", "kl_estimator"):
        help_text = Algorithm.model_fields[family].description
        assert all(f"{name} (" in help_text or f"{name}," in help_text or f"{name}." in help_text
                   for name in FAMILIES[family].specs), family
    assert "gae (GAE (PPO); needs a critic)" in Algorithm.model_fields["advantage"].description


def test_specs_choices_and_recipe_validation_load_no_torch():
    code = ("import sys\nimport workbench.algorithms, workbench.core.choices, workbench.recipe\n"
            "from workbench.algorithms import inert_knobs\nfrom workbench.recipe import load_recipe\n"
            "inert_knobs(load_recipe('grpo'))\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_capability_checks_read_the_specs():
    for name, s in FAMILIES["advantage"].specs.items():
        critic = ["algorithm.critic=true"] if s.needs_critic else []
        extra = ["algorithm.multi_objective_aggregation=sum_then_normalize"]
        recipe = load_recipe("grpo", [f"algorithm.advantage={name}", *critic, *extra])
        assert recipe.token_level == (s.level == "token"), name
        if s.needs_groups:
            with pytest.raises(ValueError, match="needs a group baseline"):
                load_recipe("grpo", [f"algorithm.advantage={name}", "sampling.num_generations=1", *critic])
        else:
            load_recipe("grpo", [f"algorithm.advantage={name}", "sampling.num_generations=1", *critic])
        if s.needs_critic:
            with pytest.raises(ValueError, match="needs algorithm.critic=true"):
                load_recipe("grpo", [f"algorithm.advantage={name}"])


# ---- inert knobs ---------------------------------------------------------------------------------

def inert(**sets) -> dict[str, str]:
    data: dict = {}
    for path, value in sets.items():
        section, field = path.split("__")
        data.setdefault(section, {})[field] = value
    return inert_knobs(data)


def test_eps_high_of_the_clip_is_inert_only_while_every_ratio_is_1():
    assert "train.mu=1 and train.minibatches=1" in inert()["algorithm.eps_high"]
    assert {"algorithm.eps_low", "algorithm.eps_high", "algorithm.clip_c", "algorithm.delta"} <= set(inert())
    for moved in ({"train__mu": 2}, {"train__minibatches": 2}):
        assert not {"algorithm.eps_low", "algorithm.eps_high", "algorithm.clip_c", "algorithm.delta"} & set(inert(**moved))


def test_inert_knobs_of_the_grpo_preset_exactly():
    assert set(inert_knobs(load_recipe("grpo"))) == {
        "algorithm.eps_low", "algorithm.eps_high", "algorithm.clip_c", "algorithm.delta",  # mu = 1, one minibatch
        "algorithm.gspo_variant", "algorithm.cispo_bounds", "algorithm.reinforce_form", "algorithm.sapo_tau_pos",
        "algorithm.sapo_tau_neg", "algorithm.clip_cov_ratio", "algorithm.clip_cov_lb", "algorithm.clip_cov_ub",
        "algorithm.kl_cov_ratio", "algorithm.kl_cov_coef", "algorithm.cov_seed", "algorithm.vespo_k_pos",
        "algorithm.vespo_lambda_pos", "algorithm.vespo_k_neg", "algorithm.vespo_lambda_neg", "algorithm.dro_beta",  # not read by clip
        "algorithm.gamma", "algorithm.lam", "algorithm.gpg_alpha",  # not read by grpo
        "algorithm.value_clip", "algorithm.vf_coef", "optim.critic_lr",  # no critic
        "teacher.kl_coef", "teacher.kl_discount", "teacher.mode",  # no teacher
        "algorithm.kl_target", "algorithm.kl_horizon",  # kl_controller=fixed
        "algorithm.rollout_correction_min", "algorithm.rollout_correction_max",  # rollout_correction=none
        "algorithm.rollout_correction_batch_normalize",
        "algorithm.rollout_rejection_min", "algorithm.rollout_rejection_max",  # rollout_rejection=none
    } | ({"algorithm.kl_estimator", "algorithm.kl_placement", "algorithm.kl_controller"} if load_recipe("grpo").algorithm.kl_coef == 0 else set())


def test_inert_knob_reasons():
    got = inert(algorithm__policy_loss="clip", train__mu=2)
    assert got["algorithm.sapo_tau_pos"] == "algorithm.policy_loss='clip' does not read it (read by policy_loss sapo)"
    assert "clip_cov" in got["algorithm.clip_cov_lb"] and "algorithm.cov_seed" in got
    assert "algorithm.sapo_tau_pos" not in inert(algorithm__policy_loss="sapo", train__mu=2)
    assert "algorithm.sapo_tau_pos" in inert(algorithm__policy_loss="sapo")  # on-policy: the gate passes the whole gradient
    assert not {"algorithm.clip_cov_lb", "algorithm.cov_seed"} & set(inert(algorithm__policy_loss="clip_cov"))
    assert got["algorithm.kl_estimator"] == "algorithm.kl_coef=0: no KL term, no reference model"
    assert "algorithm.kl_estimator" not in inert(algorithm__kl_coef=0.04)
    for name, s in FAMILIES["advantage"].specs.items():  # gamma / lam only for the token-level estimators that read them
        critic = {"algorithm__critic": True} if s.needs_critic else {}
        got = inert(algorithm__advantage=name, **critic)
        assert ("algorithm.gamma" in got) == ("algorithm.gamma" not in s.knob_fields), name
        assert s.level == "token" or "algorithm.gamma" in got, name  # a sequence-level estimator never discounts
        assert ("algorithm.lam" in got) == (not s.needs_critic), name
        assert ("algorithm.vf_coef" in got) == (not s.needs_critic), name
    assert "algorithm.adv_eps" in inert(algorithm__grpo_scale="none") and "algorithm.adv_eps" not in inert()
    assert inert()["algorithm.rollout_rejection_max"] == "algorithm.rollout_rejection='none': no rejection to bound"
    on = inert(algorithm__rollout_correction="token_truncate", algorithm__rollout_rejection="seq_mean_k1",
               algorithm__rollout_rejection_max=2.0)
    assert not {"algorithm.rollout_correction_max", "algorithm.rollout_correction_batch_normalize",
                "algorithm.rollout_rejection_max", "algorithm.rollout_rejection_min"} & set(on)
    assert set(inert(algorithm__policy_loss="cispo")) >= {"algorithm.eps_low", "algorithm.eps_high"}
    # absolute bounds have no lower one: eps_low is inert at any mu, and really changes nothing off-policy
    absolute = inert(algorithm__policy_loss="cispo", algorithm__cispo_bounds="absolute", train__mu=2)
    assert absolute["algorithm.eps_low"] == "algorithm.cispo_bounds='absolute': the weight has no lower bound"
    assert "algorithm.eps_low" not in inert(algorithm__policy_loss="cispo", train__mu=2)
    base = _loss_and_grad("cispo", {"cispo_bounds": "absolute", "eps_high": 5.0}, -0.7)
    other = _loss_and_grad("cispo", {"cispo_bounds": "absolute", "eps_high": 5.0, "eps_low": 0.9}, -0.7)
    assert base[0] == other[0] and base[1].equal(other[1])
    assert "algorithm.eps_high" not in inert(algorithm__policy_loss="cispo", algorithm__cispo_bounds="absolute",
                                             algorithm__eps_high=0.5)
    assert "teacher.mode" not in inert(teacher__model="tiny-teacher")
    assert inert(teacher__model=None)["teacher.kl_coef"] == "teacher.model is null: no distillation"


# ---- what the inert claims rest on: the registered functions themselves ------------------------------

ALTERNATIVES = {"eps_low": 0.05, "eps_high": 0.5, "clip_c": 3.0, "delta": 3.0, "gspo_variant": "token",
                "cispo_bounds": "absolute", "reinforce_form": "ratio", "sapo_tau_pos": 3.0, "sapo_tau_neg": 4.0,
                "clip_cov_ratio": 0.5, "clip_cov_lb": -5.0, "clip_cov_ub": 50.0, "kl_cov_ratio": 0.5, "kl_cov_coef": 2.0,
                "cov_seed": 7, "vespo_k_pos": 5.0, "vespo_lambda_pos": 1.0, "vespo_k_neg": 1.0, "vespo_lambda_neg": 5.0,
                "dro_beta": 0.5}


def _loss_and_grad(name, cfg, log_ratio):
    import torch

    from workbench.core import PolicyLossConfig, aggregate_loss, compute_policy_loss

    g = torch.Generator().manual_seed(0)
    old = torch.log(torch.rand(4, 5, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    logp = (old + log_ratio * torch.randn(4, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = old if log_ratio else logp.detach()  # one update per batch: the trainer's old = sg(logp)
    adv = torch.tensor([[1.5], [-1.0], [0.5], [-2.0]], dtype=torch.float64).expand(4, 5)
    mask = torch.ones(4, 5, dtype=torch.float64)
    loss, _ = compute_policy_loss(name, logp, old, adv, mask, PolicyLossConfig(cov_seed=0, **cfg) if "cov_seed" not in cfg
                                  else PolicyLossConfig(**cfg))
    total = aggregate_loss("token-mean", loss, mask)
    (grad,) = torch.autograd.grad(total, logp)
    return total.item(), grad


@pytest.mark.parametrize("loss", list(FAMILIES["policy_loss"].specs))
def test_a_knob_its_spec_does_not_list_changes_nothing(loss):
    s = FAMILIES["policy_loss"].specs[loss]
    base = _loss_and_grad(loss, {}, 0.7)
    for knob, value in ALTERNATIVES.items():
        if f"algorithm.{knob}" not in s.knob_fields:
            other = _loss_and_grad(loss, {knob: value}, 0.7)
            assert other[0] == base[0] and other[1].equal(base[1]), (loss, knob)


@pytest.mark.parametrize("loss", list(FAMILIES["policy_loss"].specs))
def test_a_knob_inert_at_one_update_per_batch_leaves_the_gradient_unchanged(loss):
    s = FAMILIES["policy_loss"].specs[loss]
    data = Recipe.from_dict({"algorithm": {"policy_loss": loss}}).to_dict()
    claimed = s.inert_when(data) if s.inert_when else {}
    _, base = _loss_and_grad(loss, {}, 0.0)
    for path in claimed:
        knob = path.removeprefix("algorithm.")
        _, grad = _loss_and_grad(loss, {knob: ALTERNATIVES[knob]}, 0.0)
        assert grad.equal(base), (loss, knob)
