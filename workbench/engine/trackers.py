"""Experiment trackers through accelerate (``logging.log_with``): what each tracker name becomes,
under which project and run name, and what each records when the run ends.

Every tracker gets the same three things: the recipe as flat ``section.field`` parameters
(``trainer.tracker_config``), each step's metric dict under its TRL names, and a link to the final
policy directory (never its weights: a 7B policy is 15 GB, and the run directory already keeps it).

- ``mlflow``: accelerate's MLflowTracker, pointed at ``logging.mlflow_tracking_uri`` when the recipe
  names a server; the run is named after the run directory (a resumed run continues the newest MLflow
  run of that name, re-logging the steps after its checkpoint); metric names keep TRL's spelling, with
  a character MLflow refuses (``eval/pass@1``) written as ``_``, exactly as transformers'
  MLflowCallback writes it; the final policy is the run tags ``workbench.final_model`` (its
  ``file://`` URI) and ``workbench.host`` (the machine holding it); the MLflow run ends FINISHED,
  FAILED or KILLED as the workbench run did (KILLED also when the scheduler interrupted it).
- ``trackio``: accelerate's TrackioTracker, the run named after the run directory (a resumed run
  continues it); the final policy is a reference artifact ``policy-RUN`` of type ``model`` whose
  entries are the directory's files as ``file://`` URIs (trackio copies no bytes).
- ``tensorboard`` / ``wandb``: accelerate's own, by name.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any, Callable

from accelerate.tracking import GeneralTracker, MLflowTracker, TrackioTracker, on_main_process

from workbench.recipe import Recipe

#: transformers' MLflowCallback.on_log: characters outside MLflow's metric-name alphabet become "_"
_NOT_MLFLOW_METRIC_CHARS = re.compile(r"[^0-9A-Za-z_\-\. :/]")
#: run names that go into an MLflow filter string as they are (run ids are slugs: runs/names.py)
_FILTERABLE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
#: the workbench run's final status -> the MLflow run's (mlflow.entities.RunStatus names). An
#: interrupted run (SIGTERM under WORKBENCH_SIGTERM=interrupt: SLURM preempted or requeued the job)
#: is KILLED, not FAILED: nothing in it went wrong, and its resume reopens the MLflow run.
MLFLOW_STATUS = {"finished": "FINISHED", "failed": "FAILED", "cancelled": "KILLED", "interrupted": "KILLED"}
#: tag names of the final-policy link (MLflow run tags; trackio artifact metadata)
FINAL_MODEL_TAG, HOST_TAG = "workbench.final_model", "workbench.host"


def tracker_project(recipe: Recipe) -> str:
    """The project every tracker files the run under: ``logging.project``, else the recipe's name."""
    return recipe.logging.project or recipe.name


def tracker_metrics(metrics: dict[str, Any]) -> dict[str, int | float]:
    """What a step hands the trackers: the numbers of its metric dict, less ``step`` itself (every
    tracker's x axis already; trackio refuses the name and stores it as ``__step``)."""
    return {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))}


def mlflow_metric_name(name: str) -> str:
    """``name`` as MLflow accepts it, the same way transformers' MLflowCallback writes it (TRL runs
    logged to MLflow carry these names): ``eval/pass@1`` -> ``eval/pass_1``; TRL's own names
    (``clip_ratio/low_mean``, ``completions/mean_length``) are unchanged."""
    return _NOT_MLFLOW_METRIC_CHARS.sub("_", name)


def final_model_link(final_dir: Path) -> dict[str, str]:
    """Where the final policy lies: its directory as a ``file://`` URI and the machine that holds it
    (a remote host's path means nothing without it)."""
    return {FINAL_MODEL_TAG: Path(final_dir).resolve().as_uri(), HOST_TAG: socket.gethostname()}


class WorkbenchMLflowTracker(MLflowTracker):
    """accelerate's MLflowTracker, plus the recipe's tracking server, MLflow-safe metric names,
    the final-policy tags and the run's outcome as the MLflow run's status."""

    def __init__(self, experiment_name: str, run_name: str, tracking_uri: str | None = None, resume: bool = False):
        super().__init__(experiment_name=experiment_name, run_name=run_name)
        self.tracking_uri = tracking_uri
        self.resume = resume
        self.outcome = MLFLOW_STATUS["finished"]

    @on_main_process
    def start(self):
        import mlflow

        if self.tracking_uri:  # the recipe's server wins over MLFLOW_TRACKING_URI
            mlflow.set_tracking_uri(self.tracking_uri)
        if self.resume and self.run_id is None:  # MLFLOW_RUN_ID, when set, is accelerate's choice
            self.run_id = latest_mlflow_run_id(self.experiment_name, self.run_name)
        super().start()

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        super().log({mlflow_metric_name(k): v for k, v in values.items()}, step=step, **kwargs)

    @on_main_process
    def conclude(self, status: str, final_dir: Path | None) -> None:
        import mlflow

        if final_dir is not None:
            mlflow.set_tags(final_model_link(final_dir))
        self.outcome = MLFLOW_STATUS.get(status, "FAILED")

    @on_main_process
    def finish(self):
        import mlflow

        mlflow.end_run(status=self.outcome)


def latest_mlflow_run_id(experiment_name: str, run_name: str) -> str | None:
    """The id of the newest MLflow run named ``run_name`` in the experiment (a resumed workbench run
    continues it), None when there is none or the name cannot be put in a filter safely."""
    import mlflow

    experiment = mlflow.get_experiment_by_name(experiment_name)
    if experiment is None or not _FILTERABLE_NAME.match(run_name):
        return None
    runs = mlflow.search_runs([experiment.experiment_id], filter_string=f"attributes.run_name = '{run_name}'",
                              order_by=["attributes.start_time DESC"], max_results=1, output_format="list")
    return runs[0].info.run_id if runs else None


class WorkbenchTrackioTracker(TrackioTracker):
    """accelerate's TrackioTracker with the run named after the run directory, the recipe stored
    as given, and the final policy as a reference artifact."""

    def __init__(self, project: str, run_name: str, resume: bool = False):
        super().__init__(project, name=run_name, resume="allow" if resume else "never", embed=False)
        self.run_name_in_project = run_name

    @on_main_process
    def store_init_configuration(self, values: dict):
        # accelerate calls trackio.config.update(values, allow_val_change=True) on the run's plain
        # dict, which stores allow_val_change as one more parameter
        self.run.config.update(values)

    @on_main_process
    def conclude(self, status: str, final_dir: Path | None) -> None:
        import trackio

        if final_dir is None:
            return
        link = final_model_link(final_dir)
        artifact = trackio.Artifact(f"policy-{self.run_name_in_project}", type="model", metadata=link,
                                    description="the run's final policy (a plain Hugging Face directory)")
        artifact.add_reference(link[FINAL_MODEL_TAG], checksum=False)  # one entry per file; no hashing of weights
        self.run.log_artifact(artifact)


#: tracker name -> (project, run name, recipe, resumed?) -> the tracker accelerate is given;
#: names not listed go to accelerate as they are (its own tracker, the project from init_trackers)
TRACKERS: dict[str, Callable[[str, str, Recipe, bool], GeneralTracker]] = {
    "mlflow": lambda project, run, recipe, resume: WorkbenchMLflowTracker(project, run, recipe.logging.mlflow_tracking_uri, resume),
    "trackio": lambda project, run, recipe, resume: WorkbenchTrackioTracker(project, run, resume),
}


def trackers_for(recipe: Recipe, run_dir: Path, resume: bool = False) -> list[Any]:
    """``Accelerator(log_with=...)`` for the recipe: tracker objects for the names in ``TRACKERS``,
    the other names as they are; the tracker's run is named after the run directory (the run id)."""
    project, run_name = tracker_project(recipe), Path(run_dir).name
    return [TRACKERS[name](project, run_name, recipe, resume) if name in TRACKERS else name
            for name in recipe.logging.log_with]


def conclude_trackers(trackers: list[Any], status: str, final_dir: Path | None) -> None:
    """Tell each tracker how the run ended and where its final policy is (None: no final policy),
    before accelerate's ``end_training`` finishes them."""
    for tracker in trackers:
        if hasattr(tracker, "conclude"):
            tracker.conclude(status, final_dir)
