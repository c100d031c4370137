"""Runs on a SLURM cluster: the exported sbatch script, submitted with ``sbatch``.

The app must run on a machine that can submit (a login node) and that sees the cluster's shared
filesystem: the run directory under the workbench home is where the job writes ``events.jsonl``
and ``stdout.log``, and where this launcher reads them from (no streaming channel needed).

- start: ``run_dir/job.sbatch`` = :func:`workbench.export.scripts.sbatch_script` with the
  Settings.slurm defaults and this interpreter, then ``sbatch --parsable job.sbatch``.
- alive: ``squeue -h -j ID -o %T`` while the job is known to the controller, then ``sacct``.
- cancel: ``scancel --signal=TERM`` (the trainer writes ``cancelled`` and exits), then a plain
  ``scancel`` after the grace period (SLURM's own TERM -> KILL sequence).
- read_events: bytes of ``run_dir/events.jsonl`` after the ingested offset.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from workbench.export.scripts import ExportError, SlurmOptions, sbatch_script
from workbench.recipe import Recipe, RecipeError
from workbench.runs.launchers.base import LAUNCHERS, EventChunk, LaunchError, Launcher, parse_events

SCRIPT_FILE = "job.sbatch"
EVENTS_FILE = "events.jsonl"
COMMAND_TIMEOUT_S = 30
# squeue / sacct job states (squeue(1) "JOB STATE CODES"): these mean the job still holds or waits for nodes.
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                           "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"})
# final sacct states -> the run status they imply when the trainer wrote no final event itself
FINAL_STATES = {"COMPLETED": None, "CANCELLED": "cancelled", "FAILED": "failed", "TIMEOUT": "failed",
                "OUT_OF_MEMORY": "failed", "NODE_FAIL": "failed", "PREEMPTED": "failed", "BOOT_FAIL": "failed",
                "DEADLINE": "failed", "REVOKED": "failed"}
_DEFAULTS = SimpleNamespace(partition="", account="", nodes=1, gpus_per_node=1, time="01:00:00")


def slurm_settings(settings) -> object:
    """The object holding partition/account/nodes/gpus_per_node/time: ``settings.slurm``
    (workbench.runs.Settings), or ``settings`` itself when it carries those attributes."""
    if settings is None:
        return _DEFAULTS
    return getattr(settings, "slurm", settings)


def _run(argv: list[str], *, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run a SLURM client command; LaunchError when it is missing or hangs."""
    if shutil.which(argv[0]) is None:
        raise LaunchError(f"`{argv[0]}` is not on PATH: the slurm target needs SLURM's client commands "
                          "(run the workbench on a login node of the cluster)")
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"`{' '.join(argv)}` did not answer within {COMMAND_TIMEOUT_S} s") from None
    except OSError as err:
        raise LaunchError(f"`{' '.join(argv)}` could not run: {err}") from None


def _first_word(text: str) -> str:
    """'CANCELLED by 1000\\n' -> 'CANCELLED'; '' -> ''."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line.split()[0].rstrip("+") if line.split() else ""


@LAUNCHERS.register("slurm")
class SlurmLauncher(Launcher):
    """``sbatch`` of the exported script; the job is followed with squeue / sacct."""

    scheme = "slurm"

    def options(self, run: dict) -> SlurmOptions:
        """SlurmOptions of this run: Settings.slurm defaults, this interpreter, the run's directory."""
        s = slurm_settings(self.settings)
        try:
            return SlurmOptions(nodes=int(s.nodes), gpus_per_node=int(s.gpus_per_node), time=str(s.time),
                                partition=s.partition or "", account=s.account or "",
                                python=sys.executable, run_dir=str(run["run_dir"]), job_name=str(run["id"]))
        except ExportError as err:
            raise LaunchError(f"cannot write the sbatch script: {err}") from None

    def script(self, run: dict) -> str:
        try:
            recipe = Recipe.from_yaml(run["recipe"])
        except RecipeError as err:
            raise LaunchError(f"run {run['id']}: {err}") from None
        return sbatch_script(recipe, self.options(run))

    def start(self, run: dict) -> dict:
        run_dir = Path(run["run_dir"])
        text = self.script(run)  # validates before anything is written or submitted
        if shutil.which("sbatch") is None:
            raise LaunchError("`sbatch` is not on PATH: the slurm target submits with SLURM's sbatch "
                              "(run the workbench on a login node of the cluster, or export the script "
                              "with `python -m workbench export RUN --to sbatch` and submit it there)")
        run_dir.mkdir(parents=True, exist_ok=True)  # SLURM does not create the --output directory
        path = run_dir / SCRIPT_FILE
        path.write_text(text)
        path.chmod(0o755)
        out = _run(["sbatch", "--parsable", str(path)], cwd=str(run_dir))
        if out.returncode != 0:
            raise LaunchError(f"sbatch refused the job (exit {out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
        # --parsable prints "JOBID" or "JOBID;CLUSTER"
        job_id, _, cluster = out.stdout.strip().splitlines()[-1].partition(";") if out.stdout.strip() else ("", "", "")
        if not job_id.isdigit():
            raise LaunchError(f"sbatch answered {out.stdout.strip()!r}, not a job id")
        return {"job_id": job_id, "cluster": cluster or None, "script": str(path)}

    # -- following the job -----------------------------------------------------------------------
    def _cluster_args(self, run: dict) -> list[str]:
        cluster = (run.get("handle") or {}).get("cluster")
        return ["--clusters", cluster] if cluster else []

    def state(self, run: dict) -> str | None:
        """The job's SLURM state word (RUNNING, COMPLETED, CANCELLED ...); '' when SLURM has no
        record of it; None when it cannot be told now (controller unreachable)."""
        job_id = (run.get("handle") or {}).get("job_id")
        if not job_id:
            return ""
        try:
            q = _run(["squeue", "-h", "-j", job_id, "-o", "%T", *self._cluster_args(run)])
        except LaunchError:
            return None
        if q.returncode == 0 and q.stdout.strip():
            return _first_word(q.stdout)
        if q.returncode != 0 and "invalid job id" not in (q.stderr + q.stdout).lower():
            return None  # the controller did not answer: neither alive nor gone for sure
        # Gone from the queue: accounting knows how it ended (-X: the allocation, not its steps).
        try:
            a = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", *self._cluster_args(run)])
        except LaunchError:
            return ""  # no accounting on this cluster: the job has left the queue, that is all we know
        return _first_word(a.stdout) if a.returncode == 0 else ""

    def alive(self, run: dict) -> bool | None:
        state = self.state(run)
        if state is None:
            return None
        return state in ACTIVE_STATES

    def exit_status(self, run: dict) -> tuple[str | None, str | None]:
        """After the job is gone and the trainer wrote no final event: (status, error) from sacct."""
        state = self.state(run) or ""
        status = FINAL_STATES.get(state)
        if status is None:
            return None, None
        job_id = (run.get("handle") or {}).get("job_id")
        return status, f"SLURM job {job_id} ended {state}; see stdout.log in the run directory"

    def cancel(self, run: dict, grace_s: float = 10.0) -> None:
        job_id = (run.get("handle") or {}).get("job_id")
        state = self.state(run)
        if not job_id or state == "" or (state is not None and state not in ACTIVE_STATES):
            return
        if state == "PENDING":  # nothing runs yet, a signal has no process to reach
            self._scancel(run, [])
            return
        # TERM to the job's steps: the trainer records `cancelled` and exits 130.
        self._scancel(run, ["--signal=TERM"])
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.alive(run) is False:
                return
            time.sleep(0.2)
        self._scancel(run, [])  # SLURM: TERM, KillWait, then KILL

    def _scancel(self, run: dict, options: list[str]) -> None:
        """scancel; LaunchError only if it failed *and* the job is not known to be gone (a job that
        ended meanwhile makes scancel complain, which is no failure of the cancel)."""
        job_id = run["handle"]["job_id"]
        out = _run(["scancel", *options, *self._cluster_args(run), job_id])
        if out.returncode != 0 and self.alive(run) is not False:
            raise LaunchError(f"scancel {' '.join(options)} {job_id} failed (exit {out.returncode}): "
                              f"{out.stderr.strip() or out.stdout.strip()}")

    def read_events(self, run: dict) -> EventChunk:
        offset = int(run.get("events_offset") or 0)
        try:
            with open(Path(run["run_dir"]) / EVENTS_FILE, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return EventChunk([], offset)
        return parse_events(data, offset)
