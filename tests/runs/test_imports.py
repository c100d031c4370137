"""Runs made outside the workbench, imported into the store (workbench/runs/imports.py).

TRL's logs are produced by TRL's GRPOTrainer itself in this file (trl 1.16, the built-in tiny
model, a few steps, ``report_to=["tensorboard"]``, ``save_state()``): the imported metrics must
equal what TRL logged, step for step, exactly (TensorBoard's: TRL's rounded to float32, which is
what TensorBoard stores). verl is not installed here: its JSONL (file logger) and console logs
are written by hand in the format verl 0.8's ``FileLogger.log`` and ``concat_dict_to_str`` write
(``{"step": N, "data": {...}}`` per line; ``step:N - name:value - ...`` with numpy 2's
``np.float64(x)`` reprs), and its config as the Hydra ``config.yaml`` main_ppo writes.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.test_cli import cli, leftovers
from workbench.runs import Principal, RunStore, local_principal
from workbench.runs.authz import PermissionDenied
from workbench.runs.imports import LogError, import_run, read_log, trl_names
from workbench.runs.records import NewRun

STEPS = 3
TRL_SEEDS = (1, 2)
ROWS = [{"prompt": "3+2=", "answer": "5"}, {"prompt": "7-4=", "answer": "3"},
        {"prompt": "6+1=", "answer": "7"}, {"prompt": "9-5=", "answer": "4"}]
# TRL name -> the workbench's (beta = 0, no entropy bonus: loss is the policy term alone)
RENAMED = {"loss": "loss/policy", "learning_rate": "lr", "step_time": "perf/step_time"}


def _run_trl(out: Path, model_dir: Path, seed: int) -> None:
    """TRL's GRPOTrainer on the tiny model: STEPS steps, a held-out evaluation at step 2, logging
    every step to trainer_state and TensorBoard."""
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from workbench.engine.models import load_policy
    from workbench.engine.tasks import get_task

    torch.set_num_threads(1)
    model, tokenizer = load_policy(str(model_dir))
    config = GRPOConfig(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=8, num_generations=4,
                        max_completion_length=6, beta=0.0, loss_type="dapo", epsilon_high=0.28, learning_rate=1e-3,
                        logging_steps=1, report_to=["tensorboard"], save_strategy="no", eval_strategy="steps",
                        eval_steps=2, per_device_eval_batch_size=4, use_cpu=True, bf16=False, seed=seed, disable_tqdm=True,
                        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=get_task("arithmetic").reward_functions(), args=config,
                          train_dataset=Dataset.from_list(ROWS), eval_dataset=Dataset.from_list(ROWS[:1]),
                          processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    trainer.save_state()  # output_dir/trainer_state.json, as Trainer writes it into each checkpoint


@pytest.fixture(scope="module")
def trl_outputs(tmp_path_factory, tiny_model_dir) -> dict[int, Path]:
    """seed -> TRL's output_dir (trainer_state.json, runs/<date>_<host>/events.out.tfevents.*)."""
    root = tmp_path_factory.mktemp("trl")
    for seed in TRL_SEEDS:
        _run_trl(root / f"seed{seed}", tiny_model_dir, seed)
    return {seed: root / f"seed{seed}" for seed in TRL_SEEDS}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("WORKBENCH_HOME", str(home))
    return home


def _history(out: Path) -> list[dict]:
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


def _stored(store: RunStore, run_id: str) -> dict[int, dict]:
    """step -> the metrics stored (NaN columns of other steps dropped)."""
    frame = store.metrics([run_id])
    return {int(row["step"]): {k: v for k, v in row.items() if k not in ("run_id", "step", "time")
                               and not (isinstance(v, float) and math.isnan(v))}
            for row in frame.to_dict("records")}


def _expected(history: list[dict], cast=lambda v: v) -> dict[int, dict]:
    """What the store must hold for TRL's log_history: training entries of step k at k - 1, held-out
    ones (eval_*) at k, names mapped (RENAMED), the end-of-training summary left out."""
    rows: dict[int, dict] = {}
    for entry in history:
        if "train_runtime" in entry:
            continue
        for name, value in entry.items():
            if name == "step" or value is None:
                continue
            at = min(entry["step"], STEPS - 1) if name.startswith("eval_") else entry["step"] - 1
            rows.setdefault(at, {})[RENAMED.get(name, name)] = cast(value)
    return rows


def _float32(value):
    return float(np.float32(value))


# ---- TRL: trainer_state.json and TensorBoard events, as GRPOTrainer wrote them ----------------------


def test_trl_trainer_state_is_imported_step_for_step(trl_outputs, home, tmp_path, capsys):
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    out = trl_outputs[1]
    history = _history(out)
    # the training arguments as the run wrote them (transformers' args.to_json_string(), TensorBoard's
    # args text): what --config reads beside a trainer_state.json
    acc = ea.EventAccumulator(str(next((out / "runs").iterdir())), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    args = tmp_path / "args.json"
    args.write_text(tensor_util.make_ndarray(acc.Tensors("args/text_summary")[0].tensor_proto).item().decode())

    res = cli(home, "import", str(out / "trainer_state.json"), "--config", str(args), "--group", "g", "--arm", "trl-dapo")
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip()
    assert res.stderr.startswith(f"warning: {run_id}: recipe: recovered from --config")  # what it could not recover
    store = RunStore(home / "runs.db")
    run = store.get_run(run_id)
    expected = _expected(history)
    assert _stored(store, run_id) == expected  # every value exactly TRL's, at its step
    assert any(k.startswith("eval_") for row in expected.values() for k in row)  # the held-out entries came too
    assert {"reward", "reward_std", "frac_reward_zero_std", "entropy", "clip_ratio/region_mean", "completions/mean_length",
            "loss/policy", "grad_norm", "lr", "perf/step_time"} <= set(expected[0])
    assert (run.status, run.target, run.launcher, run.group, run.arm, run.seed) == ("finished", "import", "import", "g",
                                                                                   "trl-dapo", 1)
    assert (run.last_step, run.total_steps, run.algorithm) == (STEPS - 1, STEPS, "dapo (TRL)")
    trained = [e for e in history if "reward" in e]
    assert run.reward == trained[-1]["reward"]  # the last training step's
    recipe = yaml.safe_load(run.recipe)
    assert recipe["algorithm"] == {"advantage": "grpo", "policy_loss": "clip", "aggregation": "token-mean", "kl_coef": 0.0,
                                   "eps_low": 0.2, "eps_high": 0.28, "grpo_scale": "group", "entropy_coef": 0.0,
                                   "top_entropy_quantile": 1.0, "mask_truncated": False}
    assert recipe["sampling"]["num_generations"] == 4 and recipe["sampling"]["max_completion_length"] == 6
    assert recipe["optim"]["lr"] == 1e-3 and recipe["train"] == {"mu": 1, "steps": STEPS, "seed": 1}
    assert "model" not in recipe and "task" not in recipe  # never filled in from defaults
    assert any("not in the log: model" in w for w in run.warnings)
    # the wall-time axis: TRL's step_time summed (trainer_state has no timestamps)
    times = store.metrics([run_id]).set_index("step")["time"]
    assert times[1] - times[0] == pytest.approx(trained[1]["step_time"], abs=1e-6)
    assert (home / "runs").exists() is False or not any((home / "runs").iterdir())  # no run dir: nothing copied

    # without --config the arguments come from the TensorBoard run beside it in output_dir: the same recipe
    beside = read_log(out / "trainer_state.json")
    assert beside.recipe == read_log(out / "trainer_state.json", config=args).recipe
    assert beside.config_origin == f"the TensorBoard args text in {out / 'runs'}"

    # the same log again (without its arguments, elsewhere): refused, naming the run; nothing added
    from workbench.cli import main

    assert main(["import", str(out / "trainer_state.json"), "--group", "other", "--seed", "1"]) == 2
    assert f"already imported as run {run_id} (group 'g', arm 'trl-dapo', seed 1)" in capsys.readouterr().err
    assert [r.id for r in store.runs()] == [run_id]


def test_trl_tensorboard_events_are_imported_as_tensorboard_holds_them(trl_outputs, home):
    out = trl_outputs[2]
    store = RunStore(home / "runs.db")
    run_id, warnings = import_run(out / "runs", principal=local_principal(), group="g", arm="trl-tb", store=store)
    run = store.get_run(run_id)
    # TensorBoard holds float32: TRL's values rounded to float32, exactly; the arguments come from its args text
    assert _stored(store, run_id) == _expected(_history(out), cast=_float32)
    assert (run.seed, run.status, run.arm) == (2, "finished", "trl-tb")  # the seed TRL trained with
    assert yaml.safe_load(run.recipe)["algorithm"]["aggregation"] == "token-mean"
    assert warnings == run.warnings and not any("loss" in w for w in warnings)
    # each step's time is TensorBoard's wall_time of its scalars: increasing
    times = store.metrics([run_id]).sort_values("step")["time"].tolist()
    assert times == sorted(times) and times[-1] - times[0] < 3600
    # the file alone, the folder above it and the output_dir all name the same run
    event_file = next((out / "runs").rglob("events.out.tfevents*"))
    assert read_log(event_file).rows == read_log(out).rows == read_log(out / "runs").rows


def _workbench_run(store: RunStore, home: Path, group: str, seed: int) -> str:
    """A real workbench run (the grpo preset on the tiny model, trained in this process) registered
    in ``store`` and its events ingested, as the collector does."""
    from workbench.engine.trainer import train
    from workbench.recipe import load_recipe

    recipe = load_recipe("grpo", [f"train.steps={STEPS}", f"train.seed={seed}", "logging.samples_per_step=0",
                                  "logging.diagnostics_every=0"])
    run_id = f"wb-{seed}"
    run_dir = home / "runs" / run_id
    store.create_runs([NewRun(run_id=run_id, name="grpo", algorithm="grpo", recipe_yaml=recipe.to_yaml(),
                              total_steps=STEPS, target="local", launcher="local", host="localhost", created_by="me",
                              run_dir=str(run_dir), group=group, arm="grpo")])
    assert train(recipe, run_dir) == "finished"
    store.ingest(run_id, [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()])
    return run_id


def test_imported_seeds_form_an_arm_beside_workbench_runs_in_arms_and_compare(trl_outputs, home, tiny_model_dir, capsys,
                                                                              monkeypatch):
    from tests.helpers import home_with_tiny_model
    from workbench.cli import main

    home_with_tiny_model(home, tiny_model_dir)
    store = RunStore(home / "runs.db")
    for seed in TRL_SEEDS:
        import_run(trl_outputs[seed] / "runs", principal=local_principal(), group="mixed", arm="trl-dapo", store=store)
        _workbench_run(store, home, "mixed", seed)
    arms = store.arms("mixed")
    assert {arm: [r.seed for r in runs] for arm, runs in arms.items()} == {"trl-dapo": [1, 2], "grpo": [1, 2]}
    frame = store.arm_metrics([r.id for runs in arms.values() for r in runs])
    assert set(frame["arm"]) == {"trl-dapo", "grpo"} and frame.groupby("arm")["step"].max().to_dict() == {
        "trl-dapo": STEPS - 1, "grpo": STEPS - 1}
    # the verdict table, as `compare` prints it: both arms scored over their seeds, and their pair
    assert main(["compare", "mixed", "--window", "0.5"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("reward: mean over the last 0.5")
    arm_rows = [line.split()[:2] for line in lines]
    assert ["trl-dapo", "2"] in arm_rows and ["grpo", "2"] in arm_rows  # arm, seeds
    pair = [line for line in lines if line.split()[:2] in (["trl-dapo", "grpo"], ["grpo", "trl-dapo"])]
    assert len(pair) == 1, out
    assert main(["compare", "mixed", "--metric", "entropy"]) == 0  # a mapped name both log
    assert capsys.readouterr().out.startswith("entropy: mean")

    # the app's Live / Compare page: the group opens on the arms view, both arms drawn and scored
    from streamlit import config

    from tests.ui.conftest import page

    monkeypatch.delenv("WORKBENCH_PASSWORD", raising=False)
    address = config.get_option("server.address")
    config.set_option("server.address", "127.0.0.1")  # as `make app` serves it (tests/ui/conftest.py)
    try:
        at = page("compare_page").run()
    finally:
        config.set_option("server.address", address)
    assert not at.exception
    assert at.radio(key="compare_view").value == "arms"
    reward = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    reward = next(spec for spec in reward if spec["layout"]["title"]["text"] == "Reward (batch mean)")
    assert {"trl-dapo", "grpo"} <= {trace.get("name") for trace in reward["data"]}
    per_arm = at.dataframe[0].value
    assert sorted(per_arm["arm"]) == ["grpo", "trl-dapo"] and per_arm["seeds"].tolist() == [2, 2]



# ---- verl: its file logger's JSONL and its console lines, written by hand in verl's format -------------

VERL_STEPS = {  # verl step -> its logged dict (val-core at step 0: val_before_train; at 2 with the train step's)
    0: {"val-core/openai/gsm8k/reward/mean@1": 0.125},
    1: {"training/global_step": 1, "training/epoch": 0, "critic/score/mean": 0.25, "critic/rewards/mean": 0.25,
        "actor/entropy": 0.51, "actor/pg_clipfrac": 0.012, "actor/pg_clipfrac_lower": 0.0, "actor/ppo_kl": 0.0004,
        "actor/kl_loss": 0.0011, "actor/pg_loss": -0.034, "actor/grad_norm": 0.82, "actor/lr": 1e-06,
        "response_length/mean": 211.5, "response_length/max": 512.0, "response_length/min": 33.0,
        "response_length/clip_ratio": 0.0625, "perf/time_per_step": 41.5, "timing_s/step": 41.5,
        "perf/throughput": 1234.5},
    2: {"training/global_step": 2, "training/epoch": 0, "critic/score/mean": 0.375, "critic/rewards/mean": 0.375,
        "actor/entropy": 0.49, "actor/pg_clipfrac": 0.02, "actor/pg_clipfrac_lower": 0.001, "actor/ppo_kl": -0.0002,
        "actor/kl_loss": 0.0019, "actor/pg_loss": 0.011, "actor/grad_norm": 0.77, "actor/lr": 1e-06,
        "response_length/mean": 198.25, "response_length/max": 512.0, "response_length/min": 41.0,
        "response_length/clip_ratio": 0.03125, "perf/time_per_step": 39.0, "timing_s/step": 39.0,
        "perf/throughput": 1301.0, "val-core/openai/gsm8k/reward/mean@1": 0.25},
}
VERL_MAPPED = {"critic/score/mean": "reward", "actor/entropy": "entropy", "actor/pg_clipfrac": "clip_ratio/region_mean",
               "actor/pg_clipfrac_lower": "clip_ratio/dual_mean", "actor/kl_loss": "kl", "actor/pg_loss": "loss/policy",
               "actor/grad_norm": "grad_norm", "actor/lr": "lr", "response_length/mean": "completions/mean_length",
               "response_length/max": "completions/max_length", "response_length/min": "completions/min_length",
               "response_length/clip_ratio": "completions/clipped_ratio", "perf/time_per_step": "perf/step_time"}
VERL_CONFIG = {
    "data": {"train_batch_size": 128, "max_response_length": 512, "seed": 1},
    "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False},
    "actor_rollout_ref": {
        "rollout": {"n": 8, "temperature": 1.0, "top_p": 1.0},
        "actor": {"optim": {"lr": 1e-06}, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                  "entropy_coeff": 0, "ppo_epochs": 1, "use_kl_loss": True, "kl_loss_coef": 0.001,
                  "kl_loss_type": "low_var_kl", "loss_agg_mode": "token-mean", "policy_loss": {"loss_mode": "vanilla"}}},
    "trainer": {"total_training_steps": 2, "logger": ["console", "file"]},
}


def _console_value(value) -> str:
    """pprint.pformat of a number as verl logs it: numpy 2 floats as np.float64(x), ints as they are."""
    return str(value) if isinstance(value, int) else f"np.float64({value!r})"


def _verl_expected() -> dict[int, dict]:
    """Training metrics of verl step k at k - 1; validation at k, the final one (after the last
    update, step 2) on the last row (1), as the workbench logs its final evaluation."""
    rows: dict[int, dict] = {}
    for step, data in VERL_STEPS.items():
        for name, value in data.items():
            at = min(step, 1) if name.startswith("val-") else step - 1
            rows.setdefault(at, {})[VERL_MAPPED.get(name, name)] = value
    return rows


@pytest.fixture
def verl_logs(tmp_path) -> dict[str, Path]:
    jsonl = tmp_path / "verl_run.jsonl"
    jsonl.write_text("".join(json.dumps({"step": step, "data": data}) + "\n" for step, data in VERL_STEPS.items()))
    console = tmp_path / "verl_console.log"
    lines = ["Creating file logger at verl_run.jsonl", "(TaskRunner pid=2345) {'actor_rollout_ref': {'actor': ...}}"]
    for step, data in VERL_STEPS.items():
        line = " - ".join([f"step:{step}", *(f"{k}:{_console_value(v)}" for k, v in data.items())])
        lines.append(f"(TaskRunner pid=2345) {line}" if step else line)
        lines.append("(WorkerDict pid=77) some other output: 3")
    console.write_text("\n".join(lines) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(VERL_CONFIG))
    return {"jsonl": jsonl, "console": console, "config": config}


@pytest.mark.parametrize("kind, fmt", [("jsonl", "verl-jsonl"), ("console", "verl-console")])
def test_verl_logs_are_imported_with_trl_names(verl_logs, home, kind, fmt):
    store = RunStore(home / "runs.db")
    run_id, warnings = import_run(verl_logs[kind], principal=local_principal(), config=verl_logs["config"], group="v",
                                  arm="verl-grpo", seed=7, store=store)
    run = store.get_run(run_id)
    assert _stored(store, run_id) == _verl_expected()
    assert run.launch["imported"]["format"] == fmt
    assert (run.seed, run.status, run.algorithm, run.total_steps, run.last_step) == (7, "finished", "grpo (verl)", 2, 1)
    assert run.reward == 0.375  # critic/score/mean of verl step 2 (stored at 1)
    recipe = yaml.safe_load(run.recipe)
    assert recipe["algorithm"] == {"advantage": "grpo", "grpo_scale": "group", "policy_loss": "clip",
                                   "aggregation": "token-mean",
                                   "eps_low": 0.2, "eps_high": 0.28, "clip_c": 3.0, "entropy_coef": 0, "kl_coef": 0.001,
                                   "kl_estimator": "k3", "kl_placement": "in_loss"}
    assert recipe["sampling"] == {"num_generations": 8, "prompts_per_step": 128, "max_completion_length": 512,
                                  "temperature": 1.0, "top_p": 1.0}
    assert recipe["train"] == {"mu": 1, "steps": 2, "seed": 7}
    times = store.metrics([run_id]).set_index("step")["time"]
    assert times[1] - times[0] == pytest.approx(39.0)  # timing_s/step summed: the wall-time axis
    assert "actor/ppo_kl" in _stored(store, run_id)[0]  # KL(old || new), not the reference's: kept under verl's name
    [entry] = store.audit_entries(action="import")  # who imported what, in the audit log
    assert (entry.actor, entry.target) == (local_principal().owner, run_id) and fmt.split("-")[1] in entry.detail


def test_verl_without_a_seed_or_config_says_what_is_missing(verl_logs, home):
    store = RunStore(home / "runs.db")
    with pytest.raises(LogError, match="--seed is needed"):
        import_run(verl_logs["jsonl"], principal=local_principal(), store=store)
    run_id, warnings = import_run(verl_logs["jsonl"], principal=local_principal(), seed=0, store=store)
    assert yaml.safe_load(store.get_run(run_id).recipe) == {"name": "verl-import", "train": {"steps": 2, "seed": 0}}
    assert any("no training arguments found" in w for w in warnings)


def test_trl_loss_is_mapped_only_when_it_is_the_policy_term_alone():
    assert trl_names({"beta": 0.0, "entropy_coef": 0.0})[0]["loss"] == "loss/policy"
    names, notes = trl_names({"beta": 0.04})
    assert "loss" not in names and "policy_loss" not in names and "beta=0.04" in notes[0]
    names, notes = trl_names({"beta": 0.0, "entropy_coef": 0.01})
    assert names["policy_loss"] == "loss/policy" and "loss" not in names and "entropy bonus" in notes[0]
    names, notes = trl_names(None)
    assert "loss" not in names and "without the training arguments" in notes[0]


# ---- who may import, and bad input: one line, exit 2, nothing stored -----------------------------------


def test_a_viewer_may_not_import(verl_logs, home):
    store = RunStore(home / "runs.db")
    with pytest.raises(PermissionDenied, match="permission denied: launch by ann"):
        import_run(verl_logs["jsonl"], principal=Principal("ann", "viewer", "local OS user"), seed=0, store=store)
    assert store.runs() == [] and store.audit_entries() == []


def _bad_inputs(tmp: Path) -> list[tuple[list[str], list[str]]]:
    """(CLI arguments, what the one line must say)."""
    def write(name: str, text: str) -> str:
        path = tmp / name
        path.write_text(text)
        return str(path)

    nan_state = {"log_history": [{"reward": 0.5, "step": 1}, {"reward": float("nan"), "step": 2}], "max_steps": 2}
    return [
        (["import", str(tmp / "nope.json"), "--seed", "0"], ["nope.json does not exist"]),
        (["import", write("trainer_state.json", "{not json"), "--seed", "0"], ["trainer_state.json is not JSON", "line 1"]),
        (["import", write("empty_state.json", json.dumps({"log_history": []})), "--seed", "0"],
         ["empty_state.json (trl-state) has no logged step", "nothing to import"]),
        (["import", write("notes.txt", "hello\n"), "--seed", "0"], ["format not recognised", "tensorboard", "verl-console"]),
        (["import", write("x.jsonl", "{}\n"), "--format", "csv", "--seed", "0"], ["format='csv' is not allowed", "trl-state"]),
        (["import", write("nan_state.json", json.dumps(nan_state)), "--seed", "0"],
         ["log_history[1] (step 2)", "'reward' = nan is not a finite number", "nothing was stored"]),
        (["import", write("inf.jsonl", '{"step": 1, "data": {"actor/grad_norm": Infinity}}\n'), "--seed", "0"],
         ["inf.jsonl line 1", "'actor/grad_norm' = inf is not a finite number"]),
        (["import", write("nan.log", "step:1 - critic/score/mean:np.float64(nan)\n"), "--seed", "0"],
         ["nan.log line 1", "'critic/score/mean' = nan"]),
        (["import", write("bad_step.jsonl", '{"step": -1, "data": {"a": 1}}\n'), "--seed", "0"], ["step='-1' is not allowed"]),
        (["import", write("ok.jsonl", '{"step": 1, "data": {"a": 1}}\n'), "--seed", "-3"], ["--seed=-3 is not allowed"]),
        (["import", str(tmp / "ok.jsonl"), "--seed", "0", "--group", "a b"], ["group='a b' is not allowed"]),
        (["import", str(tmp / "ok.jsonl"), "--seed", "0", "--config", write("cfg.yaml", "- a list\n")],
         ["--config", "is not a mapping"]),
    ]


def test_bad_input_is_one_line_exit_2_and_nothing_is_stored(tmp_path, home, capsys):
    from workbench.cli import main

    for argv, patterns in _bad_inputs(tmp_path):
        code = main(argv)
        captured = capsys.readouterr()
        assert code == 2, (argv, captured.err)
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, captured.err)
        assert "Traceback" not in captured.err and captured.out == ""
        for pattern in patterns:
            assert pattern in lines[0], (argv, lines[0])
        assert leftovers(home) == [], argv


def test_a_seed_other_than_the_one_trained_with_is_refused(trl_outputs, home, capsys):
    from workbench.cli import main

    assert main(["import", str(trl_outputs[1] / "runs"), "--seed", "5"]) == 2
    assert capsys.readouterr().err == ("error: --seed=5 differs from the seed the run trained with (seed=1 in its "
                                       "arguments); the seed of a run is its own: leave --seed out\n")
    assert leftovers(home) == []


def test_a_failed_write_leaves_no_half_imported_run(verl_logs, home, monkeypatch):
    store = RunStore(home / "runs.db")

    def broken_update(run_id, **fields):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store, "update_run", broken_update)  # the write after the row and its events
    with pytest.raises(sqlite3.OperationalError):
        import_run(verl_logs["jsonl"], principal=local_principal(), seed=0, store=store)
    assert store.runs() == [] and store.metrics(["x"]).empty
    with sqlite3.connect(home / "runs.db") as db:
        assert db.execute("SELECT COUNT(*) FROM metrics").fetchone() == (0,)


def test_logging_every_few_steps_keeps_steps_times_and_the_runs_length(tmp_path):
    """logging_steps=2, an evaluation at step 2, a state saved at step 4 of 10 (a checkpoint's):
    training rows at 1 and 3, the held-out row at 2; TRL's step_time is a per-step mean over the
    window, so the wall time advances by it x 2 steps; the run is 10 steps long, the log says so."""
    state = {"max_steps": 10, "log_history": [
        {"reward": 0.25, "step_time": 1.0, "learning_rate": 1e-3, "epoch": 0.5, "step": 2},
        {"eval_reward": 0.5, "eval_runtime": 0.1, "epoch": 0.5, "step": 2},
        {"reward": 0.75, "step_time": 3.0, "learning_rate": 1e-3, "epoch": 1.0, "step": 4}]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    run = read_log(tmp_path / "trainer_state.json")
    assert run.rows == {1: {"reward": 0.25, "perf/step_time": 1.0, "lr": 1e-3, "epoch": 0.5},
                        2: {"eval_reward": 0.5, "eval_runtime": 0.1},  # its entry's epoch is a training figure
                        3: {"reward": 0.75, "perf/step_time": 3.0, "lr": 1e-3, "epoch": 1.0}}
    base = run.times[1] - 2.0
    assert (run.times[2] - base, run.times[3] - base) == (2.0, 8.0)
    assert run.total_steps == 10 and "the log ends at step 4 of 10" in " ".join(run.warnings)
