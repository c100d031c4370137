"""Runs on a SLURM cluster: the exported sbatch script, submitted with ``sbatch``.

The app must run on a machine that can submit (a login node) and that sees the cluster's shared
filesystem: the run directory under the workbench home is where the job writes ``events.jsonl``
and ``stdout.log``, and where this launcher reads them from (no streaming channel needed).

- start: ``run_dir/job.sbatch`` = :func:`workbench.export.scripts.sbatch_script` with the
  Settings.slurm defaults and this interpreter, then ``sbatch --parsable job.sbatch``. A resume
  submits a new job (``train --resume RUN_DIR``, log appended) for the same run and run dir; the
  handle then holds the new job id and the earlier attempts' ids (``previous_job_ids``).
- alive: ``squeue -h -j ID -o %T`` while the job waits or runs; once it has left the queue, its
  final record (below). A job SLURM requeued (node failure, preemption) is PENDING again: alive,
  and its script continues the run from the newest checkpoint when it starts again.
- cancel: ``scancel --signal=INT`` to the job's steps (the trainer writes ``cancelled`` and exits),
  then a plain ``scancel`` after the grace period (SLURM's own TERM -> KillWait -> KILL). TERM is
  not the cancel signal here: SLURM sends it for its own reasons too (time limit, node failure,
  preemption), and the sbatch script tells the trainer so (``WORKBENCH_SIGTERM=interrupt``: it
  stops without a final status and the job's state decides).
- read_events: bytes of ``run_dir/events.jsonl`` after the ingested offset.
- exit_status: the job's final JobState and ExitCode (a failed job: its exit code and the last
  line of stdout.log before SLURM's own notices, as for the other targets), from ``scontrol show job`` while the controller
  still holds the job (MinJobAge, 300 s by default, after it ended), else from ``sacct`` (a
  cluster with accounting, slurmdbd). A cluster without accounting answers only the former.

The allocation (nodes, GPUs per node, time, partition, account) comes from the settings' slurm
section; the number of processes follows from it (nodes x GPUs per node).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from workbench.export.scripts import ExportError, SlurmOptions, sbatch_script
from workbench.recipe import Recipe, RecipeError
from workbench.runs.launchers.base import (LAUNCHERS, STDOUT_FILE, EventChunk, LaunchError, Launcher,
                                           read_run_dir_events, status_from_exit_code)

SCRIPT_FILE = "job.sbatch"
COMMAND_TIMEOUT_S = 30
# squeue / sacct job states (squeue(1) "JOB STATE CODES"): these mean the job still holds or waits for nodes.
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                           "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"})
# final job states -> the run status they imply when the trainer wrote no final event itself
# (FAILED with a non-zero ExitCode is explained by the exit code instead, see exit_status)
FINAL_STATES = {"COMPLETED": None, "CANCELLED": "cancelled", "FAILED": "failed", "TIMEOUT": "failed",
                "OUT_OF_MEMORY": "failed", "NODE_FAIL": "failed", "PREEMPTED": "failed", "BOOT_FAIL": "failed",
                "DEADLINE": "failed", "REVOKED": "failed"}

# what SLURM itself writes into the job's output after the trainer's last line (srun's and
# slurmstepd's notices): not the reason the trainer gave
SLURM_LOG_LINES = ("srun: ", "slurmstepd: ", "slurmstepd-")


class _NoAnswer(LaunchError):
    """A SLURM command that did not answer in time (it may still have done its work)."""


def _run(argv: list[str], *, cwd: str | None = None, timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run a SLURM client command; LaunchError when it is missing or hangs."""
    if shutil.which(argv[0]) is None:
        raise LaunchError(f"`{argv[0]}` is not on PATH: the slurm target needs SLURM's client commands "
                          "(run the workbench on a login node of the cluster)")
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise _NoAnswer(f"`{' '.join(argv)}` did not answer within {timeout} s") from None
    except OSError as err:
        raise LaunchError(f"`{' '.join(argv)}` could not run: {err}") from None


def _first_word(text: str) -> str:
    """'CANCELLED by 1000\\n' -> 'CANCELLED'; '' -> ''."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line.split()[0].rstrip("+") if line.split() else ""


def _exit_code(field: str) -> int | None:
    """SLURM's ExitCode 'CODE:SIGNAL' as a shell exit status: '1:0' -> 1, '0:9' -> 137; None if unreadable."""
    code, _, sig = field.strip().partition(":")
    if not (code.isdigit() and sig.isdigit()):
        return None
    return 128 + int(sig) if int(sig) else int(code)


def scontrol_record(text: str) -> dict[str, str]:
    """``scontrol show job -o``'s KEY=VALUE words as a dict (the first of a repeated key wins)."""
    record: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep:
            record.setdefault(key, value)
    return record


def _previous_job_ids(run: dict) -> list[str]:
    """Job ids of the run's earlier attempts, oldest first (a resume is a new job of the same run)."""
    launch = run.get("launch") or {}
    previous = (launch.get("previous_handle") or {}) if launch.get("resume") else {}
    return [*previous.get("previous_job_ids", []), *([previous["job_id"]] if previous.get("job_id") else [])]


@LAUNCHERS.register("slurm")
class SlurmLauncher(Launcher):
    """``sbatch`` of the exported script; the job is followed with squeue / scontrol / sacct."""

    scheme = "slurm"
    label = "SLURM (sbatch)"
    alive_every_s = 15.0  # each check is a squeue call to the cluster's controller
    command_timeout = COMMAND_TIMEOUT_S

    def options(self, run: dict) -> SlurmOptions:
        """SlurmOptions of this run: the settings' slurm section, this interpreter, the run's directory."""
        try:
            options = SlurmOptions(**self.settings.slurm.model_dump(), python=sys.executable,
                                   run_dir=str(run["run_dir"]), job_name=str(run["id"]),
                                   resume=bool((run.get("launch") or {}).get("resume")))
        except ExportError as err:
            raise LaunchError(f"cannot write the sbatch script: {err}") from None
        requested = int((run.get("launch") or {}).get("num_processes", 1))
        if requested > 1 and requested != options.processes:  # 1 is the launch default: "not chosen"
            raise LaunchError(
                f"run {run['id']}: num_processes={requested} does not match the SLURM layout of the settings "
                f"(slurm.nodes={options.nodes} x slurm.gpus_per_node={options.gpus_per_node} = {options.processes} "
                "process(es)); the slurm target takes its processes from that layout: change slurm.nodes / "
                "slurm.gpus_per_node in the settings, or launch without a process count")
        return options

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
        if not run_dir.is_dir():  # SLURM does not create the --output directory; the service prepares it
            raise LaunchError(f"run {run['id']}: run directory {run_dir} does not exist (a run directory is "
                              "created only by the run service, new or empty: workbench/engine/rundir.py)")
        path = run_dir / SCRIPT_FILE
        path.write_text(text)
        path.chmod(0o755)
        try:
            out = _run(["sbatch", "--parsable", str(path)], cwd=str(run_dir), timeout=self.command_timeout)
        except _NoAnswer as err:
            # sbatch may have queued the job before it hung: the run is dropped here, so say how to find it
            raise LaunchError(f"run {run['id']}: {err}; the job may have been submitted anyway (job name "
                              f"{run['id']}): check with `squeue --name={run['id']}` and cancel it with "
                              f"`scancel --name={run['id']}`") from None
        if out.returncode != 0:
            raise LaunchError(f"sbatch refused the job (exit {out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
        # --parsable prints "JOBID" or "JOBID;CLUSTER"
        job_id, _, cluster = out.stdout.strip().splitlines()[-1].partition(";") if out.stdout.strip() else ("", "", "")
        if not job_id.isdigit():
            raise LaunchError(f"run {run['id']}: sbatch answered {out.stdout.strip()!r}, not a job id; check "
                              f"`squeue --name={run['id']}` for a job it may have queued")
        handle = {"job_id": job_id, "cluster": cluster or None, "script": str(path)}
        previous = _previous_job_ids(run)
        return {**handle, "previous_job_ids": previous} if previous else handle

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
            q = _run(["squeue", "-h", "-j", job_id, "-o", "%T", *self._cluster_args(run)], timeout=self.command_timeout)
        except LaunchError:
            return None
        if q.returncode == 0 and q.stdout.strip():
            return _first_word(q.stdout)
        if q.returncode != 0 and "invalid job id" not in (q.stderr + q.stdout).lower():
            return None  # the controller did not answer: neither alive nor gone for sure
        return self._final(run)[0]  # gone from the queue: how did it end?

    def _final(self, run: dict) -> tuple[str, int | None]:
        """(State word, exit code) of a job that left the queue: the controller's record while it
        holds one, else accounting's; ('', None) when neither knows the job."""
        state, code = self._controller_record(run)
        return (state, code) if state else self._accounting(run)

    def _controller_record(self, run: dict) -> tuple[str, int | None]:
        """(JobState, exit code) from ``scontrol show job -o ID``; ('', None) when the controller
        does not hold the job (never had it, or forgot it MinJobAge after it ended) or cannot answer."""
        job_id = (run.get("handle") or {}).get("job_id")
        try:
            s = _run(["scontrol", *self._cluster_args(run), "show", "job", "-o", job_id], timeout=self.command_timeout)
        except LaunchError:
            return "", None
        if s.returncode != 0:
            return "", None
        record = scontrol_record(s.stdout)
        return _first_word(record.get("JobState", "")), _exit_code(record.get("ExitCode", ""))

    def _accounting(self, run: dict) -> tuple[str, int | None]:
        """(State word, exit code) of the job's allocation from sacct (-X: not its steps);
        ('', None) when there is no accounting record (or no accounting on this cluster)."""
        job_id = (run.get("handle") or {}).get("job_id")
        try:
            a = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode", *self._cluster_args(run)],
                     timeout=self.command_timeout)
        except LaunchError:
            return "", None
        if a.returncode != 0 or not a.stdout.strip():
            return "", None
        state, _, exit_code = a.stdout.strip().splitlines()[0].partition("|")
        return _first_word(state), _exit_code(exit_code)

    def alive(self, run: dict) -> bool | None:
        state = self.state(run)
        if state is None:
            return None
        return state in ACTIVE_STATES

    def exit_status(self, run: dict) -> tuple[str | None, str | None]:
        """After the job is gone and the trainer wrote no final event: (status, error) from the
        job's final state (controller, else accounting)."""
        job_id = (run.get("handle") or {}).get("job_id")
        if not job_id:
            return None, None
        state, code = self._final(run)
        if state == "FAILED" and code:  # the batch script exits with the trainer's status
            return status_from_exit_code(code, Path(run["run_dir"]) / STDOUT_FILE, f"SLURM job {job_id}",
                                         ignore=SLURM_LOG_LINES)
        status = FINAL_STATES.get(state)
        if status is None:
            return None, None
        return status, f"SLURM job {job_id} ended {state}; see stdout.log in the run directory"

    def cancel(self, run: dict, grace_s: float = 10.0) -> None:
        job_id = (run.get("handle") or {}).get("job_id")
        state = self.state(run)
        if not job_id or state == "" or (state is not None and state not in ACTIVE_STATES):
            return
        if state == "PENDING":  # nothing runs yet, a signal has no process to reach
            self._scancel(run, [])
            return
        # INT to the job's steps: the trainer records `cancelled` and exits 130.
        self._scancel(run, ["--signal=INT"])
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
        out = _run(["scancel", *options, *self._cluster_args(run), job_id], timeout=self.command_timeout)
        if out.returncode != 0 and self.alive(run) is not False:
            raise LaunchError(f"scancel {' '.join(options)} {job_id} failed (exit {out.returncode}): "
                              f"{out.stderr.strip() or out.stdout.strip()}")

    def read_events(self, run: dict) -> EventChunk:
        return read_run_dir_events(run)
