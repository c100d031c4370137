"""Exported scripts, executed for real: the bash script run as-is, and the sbatch script
submitted unchanged with `sbatch --wait` to a real SLURM cluster (tests/slurm_cluster.py:
slurmctld and two slurmd on this machine, nodes named after its hostname and `localhost`).

Every training here is a real `accelerate launch -m workbench train` on the CPU with the built-in
tiny model; the job's srun steps start it on the nodes SLURM allocated.
"""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import home_with_tiny_model
from workbench.engine.events import read_events
from workbench.export.scripts import BashOptions, SlurmOptions, bash_script, recipe_yaml, sbatch_script
from workbench.recipe import Recipe, load_recipe

ROOT = Path(__file__).resolve().parents[2]
# a name with quotes, command substitutions and a comment (names are one-line labels: a newline is
# refused by the recipe, so the multi-line attack rides in the description): neither breaks nor injects
HOSTILE_NAME = "evil'\"$(touch PWNED1)`touch PWNED2`; touch PWNED3 # next line"
HOSTILE_TEXT = "line1\nWORKBENCH_RECIPE\n$(touch PWNED4)\n'; touch PWNED5 #"
QUICK = ["train.steps=3", "logging.diagnostics_sequences=2", "logging.samples_per_step=2"]


@pytest.fixture(scope="module")
def home(tmp_path_factory, tiny_model_dir):
    """A workbench home with the tiny model already built (shared by this module's runs)."""
    return home_with_tiny_model(tmp_path_factory.mktemp("exporthome"), tiny_model_dir)


@pytest.fixture(scope="module")
def recipe():
    data = load_recipe("grpo", QUICK).to_dict()
    data["name"], data["description"] = HOSTILE_NAME, HOSTILE_TEXT
    return Recipe.from_dict(data)


def base_env(home: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "WORKBENCH_"))}
    env.update(WORKBENCH_HOME=str(home), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def metrics_of(run_dir: Path) -> list[dict]:
    return [e["metrics"] for e in read_events(run_dir) if e["kind"] == "metrics"]


def deterministic(metrics: list[dict]) -> list[dict]:
    """Everything but wall-clock measurements."""
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in metrics]


@pytest.fixture(scope="module")
def direct_run(home, recipe, tmp_path_factory):
    """The reference: `python -m workbench train RECIPE.yaml` in a plain process, same seed."""
    tmp = tmp_path_factory.mktemp("direct")
    path = tmp / "recipe.yaml"
    path.write_text(recipe_yaml(recipe))
    res = subprocess.run([sys.executable, "-m", "workbench", "train", str(path), "--run-dir", str(tmp / "run")],
                         env=base_env(home), cwd=tmp, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = metrics_of(tmp / "run")
    assert [m["reward"] for m in metrics] != [0.0, 0.0, 0.0]  # the comparison below compares something
    return metrics


def no_injection(*dirs: Path) -> None:
    """No file an injected `touch PWNED..` would create (in the script's cwd, the home, its runs)."""
    for d in (*dirs, *[p for p in dirs[1].glob("runs/*") if p.is_dir()]):
        assert not list(d.glob("PWNED*")), f"a name was executed in {d}"


def new_run_dirs(home: Path, before: set) -> list[Path]:
    return sorted(p for p in (home / "runs").iterdir() if p not in before) if (home / "runs").exists() else []


def test_bash_script_run_as_is_reproduces_direct_run(home, recipe, direct_run, tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(bash_script(recipe, BashOptions(python="python-not-used")))
    before = set((home / "runs").iterdir()) if (home / "runs").exists() else set()
    res = subprocess.run(["bash", str(script)], env=base_env(home, WORKBENCH_PYTHON=sys.executable), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    no_injection(tmp_path, home, ROOT)
    [run_dir] = new_run_dirs(home, before)
    assert run_dir.name.startswith("evil_touch_PWNED1_touch_PWNED2_touch_PWNED3_next_line-")
    assert Recipe.from_yaml((run_dir / "recipe.yaml").read_text()) == recipe
    exported = metrics_of(run_dir)
    assert [m["reward"] for m in exported] == [m["reward"] for m in direct_run]
    assert deterministic(exported) == deterministic(direct_run)


def submit(cluster, script: Path, env: dict[str, str], timeout: float = 400) -> tuple[str, dict[str, str], str]:
    """``sbatch --parsable --wait SCRIPT`` from the script's folder: (job id, the controller's
    record of the finished job, the job's stderr file); AssertionError if the job failed."""
    res = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], env={**env, **cluster.env}, cwd=script.parent,
                         capture_output=True, text=True, timeout=timeout)
    job_id = res.stdout.strip().split(";")[0]
    [err] = script.parent.glob(f"*-{job_id}.err") if job_id.isdigit() else [None]
    stderr = err.read_text() if err else res.stderr
    assert res.returncode == 0, stderr[-4000:]
    return job_id, cluster.job(job_id), stderr


def test_sbatch_body_on_one_node_reproduces_direct_run(home, recipe, direct_run, tmp_path, slurm_cluster):
    text = sbatch_script(recipe, SlurmOptions(nodes=1, gpus_per_node=1, python=sys.executable))
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    job_id, job, stderr = submit(slurm_cluster, script, base_env(home))
    assert (job["JobState"], job["ExitCode"], job["NumNodes"], job["TresPerNode"]) == ("COMPLETED", "0:0", "1", "gres:gpu:1")
    no_injection(tmp_path, home, ROOT)
    run_dir = home / "runs" / f"evil_touch_PWNED1_touch_PWNED2_touch_PWNED3_next_line-slurm-{job_id}"
    # the main process on the node SLURM allocated (its name is the address), port 20000 + job id mod 20000
    assert f"training nodes: {job['NodeList']}; main process: {job['NodeList']}:{20000 + int(job_id) % 20000}" in stderr
    exported = metrics_of(run_dir)
    assert [m["reward"] for m in exported] == [m["reward"] for m in direct_run]
    assert deterministic(exported) == deterministic(direct_run)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sbatch_body_on_two_nodes_runs_one_launcher_per_node(home, tmp_path, slurm_cluster):
    """Two nodes (both slurmd on this machine): srun starts one accelerate launcher per node; each
    must get its own machine rank from SLURM_PROCID and meet the other at the first node's address."""
    recipe = load_recipe("grpo", ["train.steps=2", "logging.diagnostics_every=0", "name=two-nodes"])
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_script(recipe, SlurmOptions(nodes=2, gpus_per_node=1, python=sys.executable)))
    job_id, job, stderr = submit(slurm_cluster, script, base_env(home, MAIN_PROCESS_PORT=str(free_port())))
    run_dir = home / "runs" / f"two-nodes-slurm-{job_id}"
    nodes = sorted(slurm_cluster.nodes)  # SLURM's node list order
    assert (job["NumNodes"], job["NodeList"]) == ("2", ",".join(nodes))
    assert f"training nodes: {','.join(nodes)}; main process: {nodes[0]}:" in stderr
    events = read_events(run_dir)
    assert [e for e in events if e["kind"] == "status"][0]["world_size"] == 2
    assert [e["step"] for e in events if e["kind"] == "metrics"] == [0, 1]
    assert all(m["completions/count"] == 32 for m in metrics_of(run_dir))  # 4 prompts x 8 over both nodes
    digests = [(run_dir / f"params.rank{r}.sha256").read_text() for r in (0, 1)]
    assert digests[0] == digests[1]  # rank 1 exists only if node 1 got machine rank 1
    assert events[-1]["status"] == "finished"


def test_sbatch_body_with_vllm_node(home, tmp_path, slurm_cluster):
    """--vllm-node: the last node gets `trl.scripts.vllm_serve` with the tiny model's directory,
    the first node trains; the server's fate does not decide the job's (the engine does not use it)."""
    recipe = load_recipe("grpo", ["train.steps=1", "logging.diagnostics_every=0", "name=with-vllm"])
    text = sbatch_script(recipe, SlurmOptions(nodes=1, gpus_per_node=1, vllm_node=True, python=sys.executable))
    assert '"$PYTHON" -m trl.scripts.vllm_serve --model "$MODEL" --tensor-parallel-size 1 \\' in text
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    job_id, job, stderr = submit(slurm_cluster, script, base_env(home, VLLM_PORT=str(free_port())))
    run_dir = home / "runs" / f"with-vllm-slurm-{job_id}"
    first, last = sorted(slurm_cluster.nodes)
    assert job["NodeList"] == f"{first},{last}"
    assert f"training nodes: {first}; main process: {first}:" in stderr
    vllm = re.search(r"^vLLM server node: (\S+):\d+ \(model (.+)\)$", stderr, re.M)
    assert vllm and vllm[1] == last
    model_dir = Path(vllm[2])
    assert model_dir.parent == home / "models" and (model_dir / "config.json").exists()
    assert (run_dir / "vllm_serve.log").exists()
    assert read_events(run_dir)[-1]["status"] == "finished"


def test_sbatch_script_refuses_to_run_outside_slurm(home, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_script(load_recipe("grpo"), SlurmOptions()))
    res = subprocess.run(["bash", str(script)], env=base_env(home), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "submit this script with sbatch (SLURM_JOB_NODELIST is not set)" in res.stderr
    assert not (home / "runs").exists() or not any("grpo-slurm" in p.name for p in (home / "runs").iterdir())
