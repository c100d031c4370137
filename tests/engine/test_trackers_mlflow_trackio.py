"""MLflow and trackio through accelerate, for real: a short tiny-model run with
``logging.log_with=[mlflow]`` against an ``mlflow server`` started here (SQLite backend store and
artifact root in a temp dir, 127.0.0.1), and one with ``[trackio]`` into a trackio store in a temp
dir; each is read back through the tracker's own client (MlflowClient; trackio's Api and store):

- every metric of the run's event stream, step for step, exactly as the event stream holds it,
  under its TRL name (MLflow: the name transformers' MLflowCallback would write, ``eval/pass@1`` ->
  ``eval/pass_1``), and no other metric;
- the recipe's fields as the run's parameters (``tracker_config``: flat ``section.field``);
- the final policy as a link (MLflow: run tags; trackio: a reference artifact of type model) to
  the run's ``final`` directory, whose files are there;
- the tracker's run named after the run directory, in the recipe's ``logging.project``.

mlflow / trackio missing (requirements-dev.txt): these tests fail under CI=true, skip elsewhere.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.engine.test_trainer import metrics_of
from tests.helpers import missing_component
from tests.test_cli import REPO
from workbench.engine.trackers import FINAL_MODEL_TAG, HOST_TAG, mlflow_metric_name
from workbench.engine.trainer import Trainer, tracker_config
from workbench.recipe import load_recipe

STEPS = 4
PROJECT = "wb-trackers"
SERVER_START_S = 240  # a cold `mlflow server` (tables created, app imported) took 78 s on a loaded 2-core machine
# the tracker variables of the test process's environment that would redirect these runs elsewhere
FOREIGN_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS", "MLFLOW_NESTED_RUN",
               "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_DIR")


def require(module: str):
    """The tracker's package, or fail (CI) / skip naming how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        missing_component(f"{module} is required ({err}): pip install -r requirements-dev.txt -c constraints.txt")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tracker_items(few_problems, *overrides: str) -> list[str]:
    """Four steps on four problems, with held-out eval at steps 0 and 2 (so ``eval/pass@1`` and
    ``eval/pass@k``, names MLflow refuses as they are, reach the tracker)."""
    return [f"dataset={few_problems}", f"train.steps={STEPS}", f"logging.project={PROJECT}", f"eval.dataset={few_problems}",
            "eval.every=2", "eval.num_prompts=2", "eval.pass_k=2", *overrides]


def tracker_recipe(few_problems, *overrides: str):
    return load_recipe("grpo", tracker_items(few_problems, *overrides))


def numeric_series(events: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """metric name -> [(step, value)] of every number the event stream logged but ``step`` (the
    trackers' x axis): what the trainer hands accelerate."""
    series: dict[str, list[tuple[int, float]]] = {}
    for m in events:
        for name, value in m.items():
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(name, []).append((m["step"], float(value)))
    return series


def same_points(got: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """Equal step for step and value for value (NaN equal to NaN: a tracker stores it as it came)."""
    return len(got) == len(expected) and all(
        gs == es and (gv == ev or (math.isnan(gv) and math.isnan(ev))) for (gs, gv), (es, ev) in zip(got, expected))


@pytest.fixture(scope="module")
def tracker_env():
    """No tracker variable of the caller's environment redirects these runs."""
    mp = pytest.MonkeyPatch()
    for name in FOREIGN_ENV:
        mp.delenv(name, raising=False)
    yield mp
    mp.undo()


# -- MLflow ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, tracker_env):
    """A real ``mlflow server`` on 127.0.0.1 (its own process group, stopped at the end); its URL."""
    require("mlflow")
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (root / "server.log").open("w")
    # job execution off: it starts a runner and several huey consumer processes this test never uses
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")]
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"mlflow server exited with {server.returncode}: {(root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not answer {url}/health in {SERVER_START_S} s: "
                            f"{(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its uvicorn worker
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.fixture(scope="module")
def mlflow_run(wb_home, few_problems, mlflow_server, tmp_path_factory):
    """(run dir, recipe, the MLflow run, MlflowClient) of a finished run that logged to the server."""
    from mlflow import MlflowClient

    run_dir = tmp_path_factory.mktemp("mlflow-run")
    recipe = tracker_recipe(few_problems, "logging.log_with=[mlflow]", f"logging.mlflow_tracking_uri={mlflow_server}")
    assert Trainer(recipe, run_dir).run() == "finished"
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name(PROJECT)
    assert experiment is not None, [e.name for e in client.search_experiments()]
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_name for r in runs] == [run_dir.name]
    return run_dir, recipe, runs[0], client


def test_mlflow_holds_every_metric_of_the_event_stream_step_for_step(mlflow_run):
    run_dir, _, run, client = mlflow_run
    series = numeric_series(metrics_of(run_dir))
    assert {"eval/pass@1", "reward", "kl", "clip_ratio/region_mean", "completions/mean_length"} <= set(series)
    assert set(run.data.metrics) == {mlflow_metric_name(name) for name in series}
    for name, expected in series.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, mlflow_metric_name(name)))
        assert same_points(history, expected), (name, history, expected)
    assert [step for step, _ in series["reward"]] == list(range(STEPS))
    assert len({v for _, v in series["reward"]}) > 1  # real per-step values, not one repeated number


def test_mlflow_names_keep_trl_spelling_and_write_what_it_refuses_as_transformers_does():
    assert mlflow_metric_name("clip_ratio/low_mean") == "clip_ratio/low_mean"
    assert mlflow_metric_name("sampling/importance_sampling_ratio/min") == "sampling/importance_sampling_ratio/min"
    assert mlflow_metric_name("eval/pass@1") == "eval/pass_1"
    assert mlflow_metric_name("rewards/f(x)/mean") == "rewards/f_x_/mean"


def test_mlflow_holds_the_recipe_as_parameters(mlflow_run):
    _, recipe, run, _ = mlflow_run
    assert run.data.params == {k: str(v) for k, v in tracker_config(recipe.to_dict()).items()}
    assert run.data.params["algorithm.kl_coef"] == "0.04" and run.data.params["logging.log_with"] == "['mlflow']"


def test_mlflow_links_the_final_policy_and_ends_finished(mlflow_run):
    run_dir, _, run, client = mlflow_run
    final = (run_dir / "final").resolve()
    assert run.data.tags[FINAL_MODEL_TAG] == final.as_uri() and run.data.tags[HOST_TAG] == socket.gethostname()
    assert (final / "config.json").is_file() and list(final.glob("*.safetensors"))
    assert client.list_artifacts(run.info.run_id) == []  # a link: no weights uploaded
    assert run.info.status == "FINISHED"


def test_a_failed_run_ends_its_mlflow_run_failed_without_a_policy_link(wb_home, few_problems, mlflow_server, tmp_path):
    """A reward function that raises at step 2: the MLflow run holds steps 0 and 1, ends FAILED
    (the workbench run's status), and links no final policy (there is none)."""
    from mlflow import MlflowClient

    recipe = load_recipe("grpo", [f"dataset={few_problems}", "train.steps=4", "logging.project=wb-trackers-failed",
                                  "reward_funcs=['tests.engine.faulty_rewards:raises_at_step_2']",
                                  "logging.log_with=[mlflow]", f"logging.mlflow_tracking_uri={mlflow_server}"])
    assert Trainer(recipe, tmp_path / "run").run() == "failed"
    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("wb-trackers-failed").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward")] == [0, 1]
    assert FINAL_MODEL_TAG not in run.data.tags and not (tmp_path / "run" / "final").exists()


# -- trackio -----------------------------------------------------------------------------------------
# trackio reads TRACKIO_DIR once, at its first import, and importing TRL (other tests do) imports it:
# so the trackio runs train in processes of their own (`python -m workbench train`, as a launcher
# runs them) and the store is read back by tests/engine/trackio_probe.py in another.
TRAIN_S = 900  # a 4-step tiny run with eval took ~40 s here; a loaded 2-core CI machine is slower


def tracker_process_env(wb_home: Path, trackio_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
    return {**env, "WORKBENCH_HOME": str(wb_home), "PYTHONPATH": str(REPO), "TRACKIO_DIR": str(trackio_dir), **extra}


def train_in_a_process(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", "train", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=TRAIN_S)


def trackio_record(trackio_dir: Path, project: str) -> dict:
    """What trackio's Api and store hold for ``project`` (see trackio_probe.py)."""
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("trackio_probe.py")), project], cwd=REPO,
                         env=tracker_process_env(trackio_dir.parent, trackio_dir), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    record = json.loads(res.stdout)
    assert Path(record["trackio_dir"]) == trackio_dir
    return record


@pytest.fixture(scope="module")
def trackio_store(tmp_path_factory):
    """A trackio store in a temp dir, given to each process as TRACKIO_DIR."""
    require("trackio")
    return tmp_path_factory.mktemp("trackio-store")


@pytest.fixture(scope="module")
def trackio_run(wb_home, few_problems, trackio_store, tmp_path_factory):
    """(run dir, recipe, trackio's record of the run) of a finished run that logged to trackio."""
    run_dir = tmp_path_factory.mktemp("trackio-run") / "run-trackio"
    res = train_in_a_process(tracker_process_env(wb_home, trackio_store), "grpo",
                             *[a for item in tracker_items(few_problems, "logging.log_with=[trackio]") for a in ("--set", item)], "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr[-3000:]
    recipe = load_recipe(str(run_dir / "recipe.yaml"))
    runs = trackio_record(trackio_store, PROJECT)["runs"]
    assert [r["name"] for r in runs] == [run_dir.name]
    return run_dir, recipe, runs[0]


def test_trackio_holds_every_metric_of_the_event_stream_step_for_step(trackio_run):
    run_dir, _, run = trackio_run
    series = numeric_series(metrics_of(run_dir))
    logs = run["logs"]
    assert {name for row in logs for name in row} - {"step", "timestamp"} == set(series)
    for name, expected in series.items():
        stored = [(row["step"], row[name]) for row in logs if name in row]
        assert same_points(stored, expected), (name, stored, expected)
    assert [step for step, _ in series["eval/pass@1"]] == [0, 2, 3]  # eval at 0, every 2, and the final policy


def test_trackio_holds_the_recipe_as_its_config(trackio_run):
    _, recipe, run = trackio_run
    own = {k: v for k, v in run["config"].items() if not k.startswith("_")}  # trackio's _Username, _Created, _Group
    assert own == json.loads(json.dumps(tracker_config(recipe.to_dict()), default=str))


def test_trackio_links_the_final_policy_as_a_reference_artifact(trackio_run):
    run_dir, _, run = trackio_run
    final = (run_dir / "final").resolve()
    (output,) = run["output"]
    assert (output["name"], output["type"]) == (f"policy-{run_dir.name}", "model")
    artifact = run["manifests"][f"{output['name']}:v{output['version']}"]
    assert artifact["producer_run_name"] == run_dir.name
    assert artifact["metadata"] == {FINAL_MODEL_TAG: final.as_uri(), HOST_TAG: socket.gethostname()}
    files = sorted(p.name for p in final.iterdir())
    assert sorted(entry["path"] for entry in artifact["manifest"]) == files and "config.json" in files
    assert all(entry["ref"] == (final / entry["path"]).as_uri() for entry in artifact["manifest"])  # references: no copy


# -- both, across a resume ---------------------------------------------------------------------------
def test_a_resumed_run_continues_its_mlflow_and_trackio_runs(wb_home, few_problems, mlflow_server, trackio_store, tmp_path):
    """A checkpoint every step, and a reward that raises once, at step 2: the run fails, then
    ``train --resume`` (another process) continues it from its step-1 checkpoint to the end. Each
    tracker holds one run of that name with every step 0-3 exactly as the event stream holds it;
    MLflow's ends FINISHED with the final-policy link, trackio's has its artifact."""
    from mlflow import MlflowClient

    project = "wb-trackers-resumed"
    run_dir = tmp_path / "run"
    env = tracker_process_env(wb_home, trackio_store, WB_TEST_FAILED_ONCE=str(tmp_path / "failed-once"))
    sets = ["train.steps=4", "checkpoint.every=1", "checkpoint.keep_last=2", f"logging.project={project}",
            "reward_funcs=['tests.engine.faulty_rewards:raises_once_at_step_2']", "logging.log_with=[mlflow, trackio]",
            f"logging.mlflow_tracking_uri={mlflow_server}", f"dataset={few_problems}"]
    failed = train_in_a_process(env, "grpo", *[a for item in sets for a in ("--set", item)], "--run-dir", str(run_dir))
    assert failed.returncode != 0 and (tmp_path / "failed-once").exists(), failed.stderr[-3000:]
    resumed = train_in_a_process(env, "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    series = numeric_series(metrics_of(run_dir))
    assert [step for step, _ in series["reward"]] == list(range(4))

    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name(project).experiment_id])
    assert (run.info.run_name, run.info.status) == ("run", "FINISHED")
    assert run.data.tags[FINAL_MODEL_TAG] == (run_dir / "final").resolve().as_uri()
    for name, expected in series.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, mlflow_metric_name(name)))
        assert same_points(history, expected), (name, history, expected)

    (tracked,) = trackio_record(trackio_store, project)["runs"]
    assert tracked["name"] == "run"
    for name, expected in series.items():
        assert same_points([(row["step"], row[name]) for row in tracked["logs"] if name in row], expected), name
    assert [a["name"] for a in tracked["output"]] == ["policy-run"]


def test_an_interrupted_run_ends_its_mlflow_run_killed(wb_home, few_problems, mlflow_server, tmp_path):
    """SIGTERM under WORKBENCH_SIGTERM=interrupt (what the sbatch script sets: SLURM preempts or
    requeues the job) after step 1: the process exits 143 and the MLflow run is KILLED, not FAILED,
    holding the steps it logged."""
    from mlflow import MlflowClient

    project, run_dir = "wb-trackers-interrupted", tmp_path / "run"
    sets = [f"dataset={few_problems}", "train.steps=200", f"logging.project={project}", "logging.log_with=[mlflow]",
            f"logging.mlflow_tracking_uri={mlflow_server}"]
    env = tracker_process_env(wb_home, tmp_path / "trackio", WORKBENCH_SIGTERM="interrupt")
    train = subprocess.Popen([sys.executable, "-m", "workbench", "train", "grpo", *[a for i in sets for a in ("--set", i)],
                              "--run-dir", str(run_dir)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TRAIN_S
        while not (run_dir.exists() and len(metrics_of(run_dir)) >= 2):
            assert train.poll() is None and time.monotonic() < deadline, train.stderr.read()[-3000:] if train.stderr else ""
            time.sleep(0.5)
        train.send_signal(signal.SIGTERM)
        assert train.wait(timeout=300) == 143
    finally:
        if train.poll() is None:
            train.kill()
    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name(project).experiment_id])
    assert run.info.status == "KILLED"
    logged = [m.step for m in client.get_metric_history(run.info.run_id, "reward")]
    assert logged == [step for step, _ in numeric_series(metrics_of(run_dir))["reward"]] and len(logged) >= 2


# -- the recipe fields ---------------------------------------------------------------------------
@pytest.mark.parametrize("item, expected", [
    ("logging.project=a/b", "logging.project='a/b'"),
    ("logging.mlflow_tracking_uri=file:///etc/mlruns", "http://HOST[:PORT]"),
    ("logging.mlflow_tracking_uri=http://me:s3cret@mlflow.example.org", "MLFLOW_TRACKING_PASSWORD"),
])
def test_a_bad_tracker_field_is_one_line_through_the_cli_and_leaves_nothing(tmp_path, item, expected):
    from tests.test_cli import assert_one_line_error, cli, leftovers

    res = cli(tmp_path, "train", "grpo", "--set", item, "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(res, item.split("=", 1)[0], expected)
    assert "s3cret" not in res.stdout + res.stderr  # a refused URL is repeated without its password
    assert not (tmp_path / "run").exists() and leftovers(tmp_path) == []


def test_no_error_repeats_the_credentials_of_a_url():
    """Every value an error shows goes through ``short``: a URL's user:password@ is masked there."""
    from workbench.yamlsafe import short

    assert short("https://me:s3cret@mlflow.lab:5000/x") == "'https://***@mlflow.lab:5000/x'"
    assert short({"a": ["postgresql://wb:pw@db/wb"]}) == "{'a': ['postgresql://***@db/wb']}"
    assert short("ada@lab.org") == "'ada@lab.org'"  # an email is no URL


@pytest.mark.parametrize("item", ["logging.project=..", "logging.project=-x", f"logging.project={'p' * 129}",
                                  "logging.mlflow_tracking_uri=sqlite:///mlflow.db", "logging.mlflow_tracking_uri=mlflow:5000",
                                  "logging.mlflow_tracking_uri=http://mlflow:99999", "logging.mlflow_tracking_uri='http://a b'",
                                  "logging.mlflow_tracking_uri=http://", f"logging.mlflow_tracking_uri=http://{'h' * 2100}"])
def test_tracker_fields_refuse_what_is_not_a_project_name_or_a_tracking_server(item):
    from workbench.recipe import RecipeError

    with pytest.raises(RecipeError) as info:
        load_recipe("grpo", [item])
    assert item.split("=", 1)[0] in str(info.value) and len(str(info.value)) < 600


def test_tracker_fields_take_a_project_name_and_a_tracking_server():
    from workbench.engine.trackers import tracker_project

    recipe = load_recipe("grpo", ["logging.project=rl-sweeps.v2", "logging.mlflow_tracking_uri=https://mlflow.example.org:5000/ml"])
    assert (recipe.logging.project, recipe.logging.mlflow_tracking_uri) == ("rl-sweeps.v2", "https://mlflow.example.org:5000/ml")
    assert tracker_project(recipe) == "rl-sweeps.v2" and tracker_project(load_recipe("grpo")) == "grpo"
