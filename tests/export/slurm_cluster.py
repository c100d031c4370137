"""A one-machine stand-in for a SLURM cluster: small shims of sbatch, srun, squeue, sacct, scancel
and scontrol put first on PATH.

The shims stand in for the *cluster* (the controller and the node daemons that this machine does
not have), never for the code under test: the exported sbatch script and the SlurmLauncher run
unchanged against them. What they emulate, from the SLURM man pages:

- sbatch --parsable SCRIPT: prints the job id, runs the script in the background (its own
  session) with SLURM_JOB_ID, SLURM_JOB_NODELIST (N fake node names, N = #SBATCH --nodes),
  SLURM_NNODES, SLURM_NODEID=0, SLURM_PROCID=0; stdout/stderr to #SBATCH --output / --error
  (%j = job id, relative to the submit directory).
- srun [--opt=value ...] CMD...: --ntasks copies of CMD, task i with SLURM_PROCID=i and
  SLURM_NODEID=i (one task per node), each in its own process group (a job step); exits non-zero
  if a task did.
- scontrol show hostnames LIST: one line per comma-separated name, every name mapped to this
  machine's hostname (all "nodes" are this machine).
- squeue -h -j ID -o %T: PENDING / RUNNING while the job is active, nothing once it ended,
  "Invalid job id specified" (exit 1) for an unknown id.
- sacct -n -X -P -j ID -o State[,ExitCode]: COMPLETED / FAILED / CANCELLED by UID, and the batch
  batch shell's ExitCode as CODE:SIGNAL ('1:0' for exit status 1, '0:9' when SIGKILL ended it).
- scancel --signal=TERM ID: TERM to every process of the job's steps (not the batch shell);
  scancel ID: KILL to the batch shell and the steps, state CANCELLED.

State lives in $SLURM_SHIM_STATE (one directory per test).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from pathlib import Path

_COMMON = r'''
import json, os, signal, socket, subprocess, sys, time
from pathlib import Path
STATE = Path(os.environ["SLURM_SHIM_STATE"])
STATE.mkdir(parents=True, exist_ok=True)
ACTIVE = ("PENDING", "RUNNING")
def job_file(job, suffix):
    return STATE / f"{job}.{suffix}"
def read(job, suffix, default=""):
    try:
        return job_file(job, suffix).read_text()
    except FileNotFoundError:
        return default
'''

_SBATCH = _COMMON + r'''
def directives(text):
    found = {}
    for line in text.splitlines()[1:]:
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].strip().partition("=")
            found[key] = value
        elif line.strip() and not line.startswith("#"):
            break  # sbatch stops at the first command
    return found

def run_job(job):
    """The batch step: runs in its own session; outlives the sbatch call like slurmstepd."""
    signal.signal(signal.SIGTERM, lambda *a: None)  # only steps get scancel --signal (handler resets on exec)
    meta = json.loads(read(job, "json"))
    env = dict(os.environ, SLURM_JOB_ID=job, SLURM_JOBID=job, SLURM_JOB_NAME=meta["name"],
               SLURM_JOB_NODELIST=",".join(f"shimnode{i}" for i in range(meta["nodes"])),
               SLURM_NNODES=str(meta["nodes"]), SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0",
               SLURM_SUBMIT_DIR=meta["cwd"])
    out = open(meta["output"], "ab")
    err = out if meta["error"] == meta["output"] else open(meta["error"], "ab")
    job_file(job, "state").write_text("RUNNING")
    proc = subprocess.Popen(["bash", str(job_file(job, "sh"))], cwd=meta["cwd"], env=env, stdin=subprocess.DEVNULL,
                            stdout=out, stderr=err)
    job_file(job, "batchpid").write_text(str(proc.pid))
    rc = proc.wait()
    job_file(job, "rc").write_text(str(rc))
    final = "CANCELLED" if job_file(job, "cancelled").exists() else ("COMPLETED" if rc == 0 else "FAILED")
    job_file(job, "state").write_text(final)

if sys.argv[1] == "--shim-run":
    run_job(sys.argv[2])
    sys.exit(0)
args = [a for a in sys.argv[1:] if a != "--parsable"]
script = Path(args[-1]).resolve()
text = script.read_text()
d = directives(text)
counter = STATE / "next_id"
job = str(int(counter.read_text()) if counter.exists() else 4001)
counter.write_text(str(int(job) + 1))
cwd = os.getcwd()
output = os.path.join(cwd, d.get("--output", "slurm-%j.out").replace("%j", job))
error = os.path.join(cwd, d["--error"].replace("%j", job)) if "--error" in d else output
job_file(job, "sh").write_text(text)  # sbatch keeps a copy: later edits do not change the job
job_file(job, "json").write_text(json.dumps({"nodes": int(d.get("--nodes", "1")), "name": d.get("--job-name", script.name),
                                             "output": output, "error": error, "cwd": cwd}))
job_file(job, "state").write_text("PENDING")
subprocess.Popen([sys.executable, __file__, "--shim-run", job], start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(job)
'''

_SRUN = _COMMON + r'''
args, opts = sys.argv[1:], {}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
ntasks = int(opts.get("--ntasks", "1"))
job = os.environ.get("SLURM_JOB_ID", "0")
with open(STATE / "srun.log", "a") as log:
    log.write(json.dumps({"job": job, "options": opts, "command": args}) + "\n")
procs = []
for i in range(ntasks):
    env = dict(os.environ, SLURM_PROCID=str(i), SLURM_NODEID=str(i), SLURM_LOCALID="0", SLURM_NTASKS=str(ntasks))
    procs.append(subprocess.Popen(args, env=env, start_new_session=True))  # a step: its own process group
    with open(job_file(job, "steps"), "a") as steps:
        steps.write(f"{procs[-1].pid}\n")
codes = []
for p in procs:
    codes.append(p.wait())
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the step ends with its task: slurmstepd kills what is left of it
    except ProcessLookupError:
        pass
bad = [c for c in codes if c != 0]
sys.exit(0 if not bad else (128 - bad[0] if bad[0] < 0 else bad[0]))
'''

_SQUEUE = _COMMON + r'''
job = sys.argv[sys.argv.index("-j") + 1]
state = read(job, "state")
if not state:
    print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
    sys.exit(1)
if state in ACTIVE:
    print(state)
'''

_SACCT = _COMMON + r'''
job = sys.argv[sys.argv.index("-j") + 1]
fields = sys.argv[sys.argv.index("-o") + 1].split(",")
state = read(job, "state")
if state:
    rc = int(read(job, "rc", "0"))  # the batch shell's returncode (negative: killed by that signal)
    values = {"State": "CANCELLED by %d" % os.getuid() if state == "CANCELLED" else state,
              "ExitCode": f"{rc}:0" if rc >= 0 else f"0:{-rc}"}
    print("|".join(values[f] for f in fields))
'''

_SCANCEL = _COMMON + r'''
args = sys.argv[1:]
signame = next((a.split("=", 1)[1] for a in args if a.startswith("--signal=")), None)
job = [a for a in args if not a.startswith("-")][-1]
if not read(job, "state"):
    print(f"scancel: error: Kill job error on job id {job}: Invalid job id specified", file=sys.stderr)
    sys.exit(1)
def kill_group(pid, sig):
    try:
        os.killpg(int(pid), sig)
    except (ProcessLookupError, ValueError):
        pass
steps = read(job, "steps").split()
if signame:
    for pid in steps:
        kill_group(pid, getattr(signal, "SIG" + signame))
else:
    job_file(job, "cancelled").write_text("1")
    if read(job, "state") == "PENDING":
        job_file(job, "state").write_text("CANCELLED")
    for pid in steps:
        kill_group(pid, signal.SIGKILL)
    batch = read(job, "batchpid")
    if batch:
        try:
            os.kill(int(batch), signal.SIGKILL)
        except ProcessLookupError:
            pass
'''

_SCONTROL = r'''
import socket, sys
if sys.argv[1:3] != ["show", "hostnames"]:
    sys.exit(f"scontrol shim: only `scontrol show hostnames LIST`, got {sys.argv[1:]}")
for _ in sys.argv[3].split(","):
    print(socket.gethostname())
'''

SHIMS = {"sbatch": _SBATCH, "srun": _SRUN, "squeue": _SQUEUE, "sacct": _SACCT, "scancel": _SCANCEL, "scontrol": _SCONTROL}


def install_shims(bin_dir: Path, names=tuple(SHIMS)) -> Path:
    """Write the named shims (Python scripts run by this interpreter) into ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n" + SHIMS[name])
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def cluster_env(tmp_path: Path, names=tuple(SHIMS)) -> dict[str, str]:
    """Environment variables putting a fresh fake cluster first on PATH."""
    bin_dir = install_shims(tmp_path / "slurm-bin", names)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_SHIM_STATE": str(tmp_path / "slurm-state")}


def srun_calls(env: dict[str, str]) -> list[dict]:
    """What srun was asked to run, in order."""
    path = Path(env["SLURM_SHIM_STATE"]) / "srun.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def hostname() -> str:
    return socket.gethostname()
