"""Launch page: every recipe field with its help, inline errors naming the field, presets and
previous runs as starting points, comparison groups and the quick comparison (real launches)."""

import pytest
from pydantic import BaseModel

from tests.ui.conftest import page
from tests.ui.seed import add_run
from workbench import runs as wr
from workbench.recipe import Algorithm, Recipe, load_recipe
from workbench.recipe import preset_names
from workbench.ui.recipe_form import comparison_recipes, field_rows, field_specs, is_relevant, validate_form
from workbench.runs.authz import local_principal


def test_every_recipe_field_has_a_widget_with_its_docstring_as_help(home):
    at = page("launch_page").run()
    assert not at.exception
    specs = field_specs()
    # every section of the schema (a field whose type is itself a model), read from the schema
    sections = {name: f.annotation for name, f in Recipe.model_fields.items()
                if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}
    assert {"algorithm", "sampling", "optim", "train", "logging", "checkpoint"} <= set(sections)
    expected = {"name", "description", *(f for f in Recipe.model_fields if f not in sections)}
    expected |= {f"{s}.{f}" for s, model in sections.items() for f in model.model_fields}
    assert {s.path for s in specs} == expected
    keys = {w.key for kind in ("text_input", "selectbox", "checkbox", "multiselect") for w in getattr(at, kind)}
    variants = {"rf:algorithm.gspo_variant", "rf:algorithm.cispo_bounds", "rf:algorithm.reinforce_form",
                "rf:algorithm.gpg_alpha"}
    # GRPO with the clip: the knobs only other estimators / losses read (their specs say so) are not shown
    hidden = {s.key for s in specs if not is_relevant(s, {"algorithm.advantage": "grpo", "algorithm.policy_loss": "clip"})}
    assert variants <= hidden and "rf:algorithm.sapo_tau_pos" in hidden and "rf:algorithm.eps_high" not in hidden
    assert {s.key for s in specs} - hidden <= keys
    eps_low = at.text_input(key="rf:algorithm.eps_low")
    assert eps_low.value == "0.2"
    assert eps_low.help == Algorithm.model_fields["eps_low"].description
    assert at.selectbox(key="rf:algorithm.aggregation").help == Algorithm.model_fields["aggregation"].description


def test_choosing_a_preset_fills_the_fields(home):
    at = page("launch_page").run()
    at.selectbox(key="launch_preset").select("ppo").run()
    assert at.selectbox(key="rf:algorithm.advantage").value == "gae"
    assert at.checkbox(key="rf:algorithm.critic").value is True
    assert at.text_input(key="rf:algorithm.lam").value == "0.95"
    assert at.text_input(key="rf:train.minibatches").value == "2"
    assert "Proximal Policy Optimization" in at.expander[0].markdown[0].value  # the preset's paper


def test_invalid_value_shows_error_under_the_field_and_blocks_launch(home):
    at = page("launch_page").run()
    at.text_input(key="rf:algorithm.eps_low").input("-1").run()
    errors = [e.value for e in at.error]
    assert any(e.startswith("algorithm.eps_low=-1: Input should be greater than or equal to 0") for e in errors), errors
    assert at.button(key="launch_go").disabled
    at.text_input(key="rf:algorithm.eps_low").input("abc: [").run()
    assert any("algorithm.eps_low='abc: [' is not a number, list or None" in e.value for e in at.error)
    at.text_input(key="rf:algorithm.eps_low").input("0.28").run()
    assert not at.error and not at.button(key="launch_go").disabled


def test_cross_field_error_names_the_fields(home):
    at = page("launch_page").run()
    at.text_input(key="rf:train.minibatches").input("5").run()
    text = " ".join(e.value for e in at.error)
    assert "sampling.prompts_per_step x sampling.num_generations = 32" in text and "train.minibatches x train.grad_accum = 5" in text
    # the summary by the launch button names the fields (it said "Fix 1 field(s) before launching: recipe")
    assert at.error[-1].value == ("Fix these fields before launching: sampling.prompts_per_step (Sampling tab), "
                                  "sampling.num_generations (Sampling tab), train.minibatches (Training tab), "
                                  "train.grad_accum (Training tab)")


def test_algorithm_tab_shows_only_the_chosen_losss_and_estimators_options(home):
    """A GRPO recipe showed GSPO's and CISPO's options too. A variant choice named after a
    registered policy loss / estimator is shown only while that one is chosen."""
    at = page("launch_page").run()
    shown = lambda: {w.key for w in at.selectbox}  # noqa: E731
    assert "rf:algorithm.grpo_scale" in shown()
    assert not {"rf:algorithm.gspo_variant", "rf:algorithm.cispo_bounds", "rf:algorithm.reinforce_form"} & shown()
    at.selectbox(key="rf:algorithm.policy_loss").select("gspo").run()
    assert "rf:algorithm.gspo_variant" in shown() and "rf:algorithm.cispo_bounds" not in shown()
    at.selectbox(key="rf:algorithm.advantage").select("rloo").run()
    assert "rf:algorithm.grpo_scale" not in shown()
    assert not at.exception and not at.error  # hidden fields keep their values: the recipe still validates


def test_gpg_alpha_shows_when_gpg_is_the_estimator():
    """gpg_alpha is the gpg estimator's knob (its spec lists it): the gpg *loss* does not read it."""
    spec = next(s for s in field_specs() if s.path == "algorithm.gpg_alpha")
    assert not is_relevant(spec, {"algorithm.advantage": "grpo", "algorithm.policy_loss": "clip"})
    assert is_relevant(spec, {"algorithm.advantage": "gpg", "algorithm.policy_loss": "clip"})
    assert not is_relevant(spec, {"algorithm.advantage": "grpo", "algorithm.policy_loss": "gpg"})


def test_the_form_shows_exactly_the_knobs_the_chosen_specs_read():
    """Every family knob on the Algorithm tab shows iff the chosen member's spec lists it."""
    from workbench.algorithms import FAMILIES

    for loss, s in FAMILIES["policy_loss"].specs.items():
        values = {"algorithm.advantage": "grpo", "algorithm.policy_loss": loss}
        shown = {f.path for f in field_specs() if is_relevant(f, values)}
        owned = {k.field for k in FAMILIES["policy_loss"].knobs()}
        assert shown & owned == set(s.knob_fields), loss


def test_eps_low_sits_beside_eps_high_for_every_preset():
    for name in preset_names():
        data = load_recipe(name).to_dict()
        values = {s.path: data["algorithm"].get(s.label) for s in field_specs() if s.path.startswith("algorithm.")}
        fields = [s for s in field_specs() if s.path.startswith("algorithm.") and is_relevant(s, values)]
        if "algorithm.eps_low" not in [s.path for s in fields]:  # a loss that reads no clip (sapo, kl_cov, gpg)
            continue
        row = next(r for r in field_rows(fields) if "algorithm.eps_low" in [s.path for s in r])
        paths = [s.path for s in row]
        assert paths.index("algorithm.eps_high") == paths.index("algorithm.eps_low") + 1, (name, paths)


def test_an_invalid_field_in_another_tab_keeps_the_tab_bar(home):
    """The labels used to gain a warning sign, which made a new tab bar and showed the first tab."""
    at = page("launch_page").run()
    labels = [t.label for t in at.tabs]
    at.text_input(key="rf:train.minibatches").input("-3").run()
    assert at.error and [t.label for t in at.tabs] == labels == ["Algorithm", "Sampling", "Optimiser", "Training", "Logging", "Checkpoints", "Evaluation", "LoRA", "Distillation"]
    assert "train.minibatches (Training tab)" in at.error[-1].value


def test_unsafe_inputs_are_refused(home):
    base = load_recipe("grpo")
    _, errors = validate_form({"dataset": "../../etc/passwd", "model": "a;rm -rf /", "name": "a/b"}, base)
    assert errors["dataset"].startswith("dataset='../../etc/passwd' resolves outside the workbench home")
    assert errors["model"] == ("model='a;rm -rf /' is not allowed; 'tiny', a Hugging Face id like 'org/name' or a "
                               "model directory inside the workbench home")
    assert errors["name"].startswith("name='a/b': character '/' is not allowed")  # 'x y' is a name (a label)
    reward_spec = next(s for s in field_specs() if s.path == "reward_funcs")
    assert reward_spec.kind == "multi" and set(reward_spec.choices) == {"exact_match", "format", "position_match", "first_char", "reasoning_gym", "answer_format", "math_verify", "final_number"}


def test_widgets_change_the_recipe(home):
    base = load_recipe("grpo")
    recipe, errors = validate_form({"algorithm.eps_high": "0.28", "algorithm.clip_c": "3", "optim.betas": "[0.9, 0.95]",
                                    "task": "reverse", "logging.log_with": ["tensorboard"]}, base)
    assert errors == {}
    assert (recipe.algorithm.eps_high, recipe.algorithm.clip_c, recipe.optim.betas) == (0.28, 3.0, (0.9, 0.95))
    assert recipe.task == "reverse" and recipe.logging.log_with == ["tensorboard"]


def test_comparison_shares_data_and_seed_but_keeps_each_algorithm():
    base = load_recipe("grpo").with_overrides(["train.steps=7", "train.seed=5", "sampling.num_generations=4"])
    grpo, ppo = comparison_recipes(base, ["ppo"])
    assert grpo is base
    assert (ppo.name, ppo.algorithm.advantage, ppo.train.minibatches, ppo.train.mu) == ("ppo", "gae", 2, 2)
    assert (ppo.train.steps, ppo.train.seed, ppo.sampling.num_generations, ppo.task) == (7, 5, 4, "arithmetic_four")


def test_previous_run_as_starting_point(home, store):
    run_id = add_run(store, preset="dapo", name="mine")
    at = page("launch_page").run()
    at.radio(key="launch_source").set_value("Previous run").run()
    assert at.selectbox(key="launch_from_run").value == run_id
    assert at.text_input(key="rf:algorithm.eps_high").value == "0.28"  # DAPO's clip-higher
    assert at.text_input(key="rf:name").value == "dapo"


@pytest.fixture
def cleanup(store):
    yield
    for run_id in store.list_runs()["id"]:
        wr.cancel(run_id, principal=local_principal(), store=store, grace_s=5)


def test_launch_a_comparison_group_records_runs(home, store, cleanup):
    at = page("launch_page").run()
    at.text_input(key="rf:train.steps").input("2").run()
    at.multiselect(key="launch_compare").select("rloo").run()
    at.text_input(key="launch_tags").input("smoke, ui").run()
    at.button(key="launch_go").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    runs = store.list_runs()
    assert sorted(runs["algorithm"]) == ["grpo", "rloo"]
    assert set(runs["group"]) == {"grpo-vs-rloo"}
    assert all(t == ["smoke", "ui"] for t in runs["tags"])
    recipes = [Recipe.from_yaml(store.get_run(i)["recipe"]) for i in runs["id"]]
    assert [r.train.steps for r in recipes] == [2, 2] and len({r.train.seed for r in recipes}) == 1
    assert "grpo-vs-rloo" in at.success[0].value


def test_quick_comparison_launches_grpo_rloo_ppo_with_three_seeds_each(home, store, cleanup):
    at = page("launch_page").run()
    at.button(key="quick_compare").click().run()
    assert not at.exception and not at.error
    runs = store.list_runs()
    assert runs["group"].nunique() == 1 and runs["group"][0].startswith("quick-")
    assert sorted(zip(runs["arm"], runs["seed"])) == [(arm, seed) for arm in ("grpo", "ppo", "rloo") for seed in (0, 1, 2)]
    assert sorted(runs["algorithm"]) == ["grpo"] * 3 + ["ppo"] * 3 + ["rloo"] * 3


def test_seeds_and_a_sweep_launch_every_combination(home, store, cleanup):
    at = page("launch_page").run()
    at.text_input(key="rf:train.steps").input("1").run()
    at.number_input(key="launch_seeds").set_value(2).run()
    assert at.button(key="launch_go").label == "Launch 2 runs (1 arm x 2 seeds)"
    at.multiselect(key="launch_sweep_fields").select("algorithm.eps_high").run()
    at.text_input(key="launch_sweep:algorithm.eps_high").input("0.2, 0.28").run()
    # grpo at mu = 1, one minibatch: the clip never acts, so this sweep is refused with the spec's reason
    assert any(e.value.startswith("Sweep algorithm.eps_high: no effect in any arm") for e in at.error)
    at.text_input(key="rf:train.mu").input("2").run()
    assert not at.error
    assert at.button(key="launch_go").label == "Launch 4 runs (2 arms x 2 seeds)"
    at.button(key="launch_go").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    runs = store.list_runs()
    assert sorted(zip(runs["arm"], runs["seed"])) == [("grpo · eps_high=0.2", 0), ("grpo · eps_high=0.2", 1),
                                                      ("grpo · eps_high=0.28", 0), ("grpo · eps_high=0.28", 1)]
    assert set(runs["group"]) == {"grpo-sweep-x2"}
    for run_id in runs["id"]:
        run = store.get_run(run_id)
        recipe = Recipe.from_yaml(run["recipe"])
        assert (recipe.algorithm.eps_high, recipe.train.seed) == (run["sweep"]["algorithm.eps_high"], run["seed"])


def test_an_invalid_sweep_value_names_the_combination_and_launches_nothing(home, store):
    at = page("launch_page").run()
    at.multiselect(key="launch_sweep_fields").select("algorithm.eps_high").run()
    at.text_input(key="launch_sweep:algorithm.eps_high").input("0.2, -1").run()
    [error] = [e.value for e in at.error]
    assert error.startswith("arm 'grpo · eps_high=-1' seed 0 is not allowed: ")
    assert "algorithm.eps_high=-1" in error
    assert at.button(key="launch_go").disabled
    at.text_input(key="launch_sweep:algorithm.eps_high").input("0.2, [").run()
    assert [e.value for e in at.error][0].startswith("sweep 'algorithm.eps_high=0.2, [': the values are not a valid YAML list")
    assert at.button(key="launch_go").disabled and store.list_runs().empty


def test_quick_comparison_says_what_it_launched_and_a_second_click_launches_nothing(home, store, cleanup):
    """It used to give no feedback, so users clicked again and launched a second group."""
    at = page("launch_page").run()
    at.button(key="quick_compare").click().run()
    group = store.list_runs()["group"][0]
    assert group in at.success[0].value and "Watch them on **Live / Compare**" in at.success[0].value
    assert [link.proto.label for link in at.get("page_link")] == ["Open Live / Compare"]
    button = at.button(key="quick_compare")
    assert button.disabled and group in button.help  # while the group's runs are active: no second group
    at.run()
    assert at.button(key="quick_compare").disabled and len(store.list_runs()) == 9


def test_a_single_launch_says_watch_it(home, store, cleanup):
    at = page("launch_page").run()
    at.text_input(key="rf:train.steps").input("2").run()
    at.button(key="launch_go").click().run()
    assert "Launched run: `" in at.success[0].value and at.success[0].value.endswith("Watch it on **Live / Compare**.")


def test_unreachable_target_shows_the_launchers_error(home, store, monkeypatch, tmp_path):
    # a machine without SLURM's client commands (the SLURM tests install them on this one)
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    at = page("launch_page").run()
    at.selectbox(key="launch_target").select("slurm").run()
    at.button(key="launch_go").click().run()
    assert "slurm" in at.error[0].value and store.list_runs().empty  # nothing half-made is left


def test_compare_choices_leave_out_the_starting_preset_whatever_the_run_is_named(home):
    at = page("launch_page").run()
    choices = at.multiselect(key="launch_compare").options
    assert "grpo" not in choices and "rloo" in choices
    at.text_input(key="rf:name").input("rloo").run()  # the run's own name, not its algorithm
    assert at.multiselect(key="launch_compare").options == choices


def _sweep(at, field: str, values: str):
    at.multiselect(key="launch_sweep_fields").select(field).run()
    at.text_input(key=f"launch_sweep:{field}").input(values).run()
    return [e.value for e in at.error]


@pytest.mark.parametrize("case, values, expected", [
    ("alias bomb", "BOMB", "anchors and aliases"),
    ("5000 deep", "[" * 5000, "nested more than 64 levels"),
    ("5001-digit integer", "1" * 5001, "<an integer of 5001 digits>"),
])
def test_a_hostile_sweep_box_is_one_line_quickly(home, store, case, values, expected):
    """The sweep box took the 337-character alias bomb (46 s, then MemoryError), and printed a
    RecursionError / ValueError traceback for the other two."""
    import time

    from tests.test_inputs_yaml import BOMB

    at = page("launch_page").run()
    start = time.monotonic()
    errors = _sweep(at, "task_config", BOMB if values == "BOMB" else values)
    assert time.monotonic() - start < 20 and not at.exception
    [error] = errors
    assert error.startswith("sweep 'task_config'") and expected in error and "\n" not in error and len(error) < 400
    assert at.button(key="launch_go").disabled and store.list_runs().empty


OUTSIDE = "/tmp/secret-workbench-test/creds.csv"


@pytest.mark.parametrize("field, value", [("dataset", OUTSIDE), ("dataset", "../../../../../tmp/secret-workbench-test/creds.csv"),
                                          ("eval.dataset", OUTSIDE), ("model", "/tmp/secret-workbench-test"),
                                          ("model", "/tmp/secret-workbench-test/m.gguf")])
def test_a_swept_path_outside_the_home_is_refused_like_the_form(home, store, field, value):
    """A swept dataset skipped the form's confinement: a sweep to a file outside the home was
    planned, and the launch's dataset check printed that file's header columns."""
    from pathlib import Path

    secret = Path(OUTSIDE)
    secret.parent.mkdir(exist_ok=True)
    secret.write_text("user,password\nalice,hunter2\n")
    at = page("launch_page").run()
    errors = _sweep(at, field, f"data.jsonl, {value}" if "dataset" in field else f"tiny, {value}")
    assert errors and all("password" not in e and "hunter2" not in e for e in errors)
    assert any(e.startswith(f"{field}='{value}' resolves outside the workbench home") for e in errors), errors
    assert at.button(key="launch_go").disabled and store.list_runs().empty
    # the form's own field, the same rule (one helper)
    _, form_errors = validate_form({field: value}, load_recipe("grpo"))
    assert form_errors[field].startswith(f"{field}='{value}' resolves outside the workbench home")


def test_path_fields_inside_the_home_and_model_names_still_work(home):
    from workbench.ui.launch_page import _plan
    from workbench.ui.recipe_form import app_path_value

    (home / "data.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (home / "models" / "mine").mkdir(parents=True)
    assert app_path_value("dataset", "data.jsonl") == str(home / "data.jsonl")
    assert app_path_value("eval.dataset", "") is None
    for name in ("tiny", "smollm2-135m", "HuggingFaceTB/SmolLM2-135M"):
        assert app_path_value("model", name) == name
    assert app_path_value("model", "models/mine") == str(home / "models" / "mine")
    with pytest.raises(ValueError, match="no such file or directory in the workbench home"):
        app_path_value("model", "./nothing-here")
    plan = _plan(load_recipe("grpo"), [], 1, {"dataset": ["data.jsonl"]}, "local")
    assert plan.error is None and plan.planned[0].recipe.dataset == str(home / "data.jsonl")  # resolved in the home, not the cwd


def test_the_form_says_when_a_knob_has_no_effect():
    """The grpo preset trains with one update per batch: eps_low / eps_high never bite, and the form
    says so under them (from workbench.algorithms.inert_knobs); with mu = 2 they act."""
    from workbench.algorithms import inert_knobs

    at = page("launch_page").run()
    notes = lambda: [c.value for c in at.caption if "No effect here" in c.value]  # noqa: E731
    reason = inert_knobs(load_recipe("grpo"))["algorithm.eps_high"]
    assert any(reason in n for n in notes())
    at.text_input(key="rf:train.mu").input("2").run()
    assert not at.exception and not any("every ratio is exactly 1" in n for n in notes())
