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


def tracker_recipe(few_problems, *overrides: str):
    """Four steps on four problems, with held-out eval at steps 0 and 2 (so ``eval/pass@1`` and
    ``eval/pass@k``, names MLflow refuses as they are, reach the tracker)."""
    return load_recipe("grpo", [f"dataset={few_problems}", f"train.steps={STEPS}", f"logging.project={PROJECT}",
                                f"eval.dataset={few_problems}", "eval.every=2", "eval.num_prompts=2", "eval.pass_k=2",
                                *overrides])


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


# -- trackio -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trackio_store(tmp_path_factory, tracker_env):
    """A trackio store in a temp dir (TRACKIO_DIR, which trackio reads once, at import)."""
    store = tmp_path_factory.mktemp("trackio-store")
    tracker_env.setenv("TRACKIO_DIR", str(store))
    if "trackio" in sys.modules and Path(sys.modules["trackio"].utils.TRACKIO_DIR) != store:
        pytest.fail("trackio was imported before this module set TRACKIO_DIR; its store is elsewhere")
    trackio = require("trackio")
    assert Path(trackio.utils.TRACKIO_DIR) == store
    return store


@pytest.fixture(scope="module")
def trackio_run(wb_home, few_problems, trackio_store, tmp_path_factory):
    """(run dir, recipe, trackio's record of the run) of a finished run that logged to trackio."""
    import trackio

    run_dir = tmp_path_factory.mktemp("trackio-run")
    recipe = tracker_recipe(few_problems, "logging.log_with=[trackio]")
    assert Trainer(recipe, run_dir).run() == "finished"
    runs = list(trackio.Api().runs(PROJECT))
    assert [r.name for r in runs] == [run_dir.name]
    return run_dir, recipe, runs[0]


def test_trackio_holds_every_metric_of_the_event_stream_step_for_step(trackio_run):
    from trackio.sqlite_storage import SQLiteStorage

    run_dir, _, run = trackio_run
    series = numeric_series(metrics_of(run_dir))
    logs = SQLiteStorage.get_logs(PROJECT, run.name, run_id=run.id)
    assert {name for row in logs for name in row} - {"step", "timestamp"} == set(series)
    for name, expected in series.items():
        stored = [(row["step"], row[name]) for row in logs if name in row]
        assert same_points(stored, expected), (name, stored, expected)
    assert [step for step, _ in series["eval/pass@1"]] == [0, 2, 3]  # eval at 0, every 2, and the final policy


def test_trackio_holds_the_recipe_as_its_config(trackio_run):
    _, recipe, run = trackio_run
    own = {k: v for k, v in run.config.items() if not k.startswith("_")}  # trackio's _Username, _Created, _Group
    assert own == tracker_config(recipe.to_dict())


def test_trackio_links_the_final_policy_as_a_reference_artifact(trackio_run):
    from trackio.sqlite_storage import SQLiteStorage

    run_dir, _, run = trackio_run
    final = (run_dir / "final").resolve()
    (output,) = SQLiteStorage.get_run_artifacts(PROJECT, run.name, run.id)["output"]
    assert (output["name"], output["type"]) == (f"policy-{run_dir.name}", "model")
    artifact = SQLiteStorage.get_artifact_manifest(PROJECT, output["name"], f"v{output['version']}")
    assert artifact["producer_run_name"] == run_dir.name
    assert artifact["metadata"] == {FINAL_MODEL_TAG: final.as_uri(), HOST_TAG: socket.gethostname()}
    files = sorted(p.name for p in final.iterdir())
    assert sorted(entry["path"] for entry in artifact["manifest"]) == files and "config.json" in files
    assert all(entry["ref"] == (final / entry["path"]).as_uri() for entry in artifact["manifest"])  # references: no copy
