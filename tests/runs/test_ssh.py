"""The SSH launcher against a real ``sshd`` on 127.0.0.1 (own host key, client key, known_hosts).

The "remote host" is this machine reached through sshd: a temp workdir, this venv's python and a
remote WORKBENCH_HOME exported by the host's ``setup`` line. Runs go through the real service
(``launch`` / ``sync`` / ``wait`` / ``cancel``) into a real SQLite store.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.runs.helpers import sync_until
from tests.runs.sshd import free_port, start_sshd
from workbench.recipe import load_recipe
from workbench.runs import LaunchError, RunStore, Settings, SSHHost, cancel, launch, wait
from workbench.runs.launchers import ssh  # registers "ssh"
from workbench.runs.service import launcher_for
from workbench.runs.authz import Principal, local_principal

ROOT = Path(__file__).resolve().parents[2]
STEPS = 16


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def remote(sshd, tmp_path, tiny_model_dir):
    """Settings with host 'testhost' = this machine over sshd; its own workbench home with the tiny model."""
    remote_home = tmp_path / "remote_home"
    shutil.copytree(tiny_model_dir, remote_home / "models" / tiny_model_dir.name)
    workdir = tmp_path / "remote_workdir"
    setup = (f"export WORKBENCH_HOME={shlex.quote(str(remote_home))} PYTHONPATH={shlex.quote(str(ROOT))} "
             "OMP_NUM_THREADS=1")
    host = sshd.host_entry(workdir=str(workdir), python=sys.executable, setup=setup)
    return Settings(ssh_hosts={"testhost": host}), workdir


@pytest.fixture
def store(fresh_home):
    yield RunStore()
    ssh.stop_followers()


def test_stream_killed_mid_run_reattaches_and_every_step_lands_once(remote, store):
    settings, workdir = remote
    recipe = load_recipe("grpo", [f"train.steps={STEPS}"])
    run_id = launch(recipe, target="ssh://testhost", store=store, settings=settings, principal=Principal("test", "admin", "test"))
    run = store.get_run(run_id)
    remote_dir = Path(run["handle"]["remote_dir"])
    assert remote_dir == workdir / "runs" / run_id
    assert (run["launcher"], run["host"], run["status"]) == ("ssh", "testhost", "starting")
    assert (remote_dir / "recipe.yaml").read_text() == recipe.to_yaml()

    # ingest until a few steps are in and the long-lived `ssh ... tail -F` follower is attached
    run = sync_until(store, settings, run_id, lambda r: r["last_step"] >= 2 and ssh.follower_pid(run_id))
    follower = ssh.follower_pid(run_id)
    assert Path(f"/proc/{follower}/cmdline").read_bytes().split(b"\0")[0] == b"ssh"
    os.kill(follower, signal.SIGKILL)  # the link drops
    steps_at_drop = run["last_step"]
    launcher = launcher_for("ssh://testhost", settings)
    assert launcher.alive(run) is True  # the remote run goes on without its connection
    assert steps_at_drop < STEPS - 1

    followers_after = set()
    on_step = lambda r: followers_after.add(ssh.follower_pid(run_id))  # noqa: E731
    assert wait(run_id, store=store, settings=settings, poll_s=0.2, timeout_s=300, on_step=on_step) == "finished"
    assert followers_after - {None, follower}, "no new stream was attached after the drop"
    run = store.get_run(run_id)
    assert store.metrics([run_id]).step.tolist() == list(range(STEPS))
    assert (run["last_step"], run["error"]) == (STEPS - 1, None)
    # nothing skipped, nothing read twice: the ingested byte offset is the remote file's end, and the
    # local mirror the launcher keeps is byte-identical to the remote stream
    remote_bytes = (remote_dir / "events.jsonl").read_bytes()
    assert run["events_offset"] == len(remote_bytes)
    assert (Path(run["run_dir"]) / "events.jsonl").read_bytes() == remote_bytes
    remote_steps = [e["step"] for e in map(json.loads, remote_bytes.splitlines()) if e["kind"] == "metrics"]
    assert remote_steps == list(range(STEPS))
    assert store.metrics([run_id]).reward.tolist() == [
        e["metrics"]["reward"] for e in map(json.loads, remote_bytes.splitlines()) if e["kind"] == "metrics"]
    _wait_for_file(remote_dir / "exit_code")  # the final event comes before the process exits
    assert (remote_dir / "exit_code").read_text() == "0\n"
    assert launcher.alive(run) is False and ssh.follower_pid(run_id) is None


def test_cancel_reaches_the_remote_process(remote, store):
    settings, workdir = remote
    run_id = launch(load_recipe("grpo", ["train.steps=10000"]), target="ssh://testhost", principal=local_principal(), store=store, settings=settings)
    run = sync_until(store, settings, run_id, lambda r: r["last_step"] >= 1)
    pgid = run["handle"]["pgid"]
    cancel(run_id, principal=local_principal(), store=store, settings=settings, grace_s=30)
    run = store.get_run(run_id)
    assert run["status"] == "cancelled"
    events = [json.loads(line) for line in (Path(run["handle"]["remote_dir"]) / "events.jsonl").read_text().splitlines()]
    # the trainer itself got SIGTERM and wrote its final status (not a SIGKILL, not the store guessing)
    assert (events[-1]["kind"], events[-1]["status"]) == ("status", "cancelled")
    assert "SIGTERM" in events[-1].get("error", "")
    assert launcher_for("ssh://testhost", settings).alive(run) is False
    assert _group_gone(pgid)
    assert store.metrics([run_id]).step.tolist() == list(range(run["last_step"] + 1))


def _group_gone(pgid: int) -> bool:
    """No non-zombie process left in the group (this machine is the remote)."""
    out = subprocess.run(["ps", "-A", "-o", "pgid=", "-o", "stat="], capture_output=True, text=True).stdout
    return not [line for line in out.splitlines() if line.split()[0] == str(pgid) and not line.split()[1].startswith("Z")]


def test_unknown_host_key_is_refused_with_instructions_and_nothing_starts(remote, store, sshd, tmp_path):
    settings, workdir = remote
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    host = settings.ssh_hosts["testhost"].model_copy(update={"known_hosts": str(empty)})
    bad = Settings(ssh_hosts={"testhost": host})
    with pytest.raises(LaunchError) as err:
        launch(load_recipe("grpo", ["train.steps=2"]), target="ssh://testhost", principal=local_principal(), store=store, settings=bad)
    message = str(err.value)
    assert f"the host key of 127.0.0.1:{sshd.port} is not in known_hosts ({empty})" in message
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}" in message
    assert store.list_runs().empty and not (workdir / "runs").exists()
    assert list((Path(os.environ["WORKBENCH_HOME"]) / "runs").iterdir()) == []
    assert empty.read_text() == ""  # nothing was auto-accepted

    # a known_hosts entry with another key for the same address: refused as a changed key
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    changed = Settings(ssh_hosts={"testhost": host.model_copy(update={"known_hosts": str(wrong)})})
    with pytest.raises(LaunchError, match="differs from the one in .*possible man-in-the-middle"):
        launch(load_recipe("grpo", ["train.steps=2"]), target="ssh://testhost", principal=local_principal(), store=store, settings=changed)
    assert store.list_runs().empty

    # only a host whose settings turn strict checking off gets its new key recorded (accept-new)
    lenient = Settings(ssh_hosts={"testhost": host.model_copy(update={"strict_host_key_checking": False})})
    assert launcher_for("ssh://testhost", lenient).check_host().endswith(str(ROOT / "workbench" / "__init__.py"))
    assert empty.read_text().split()[1:3] == sshd.host_public_key.split()[:2]


def test_unreachable_host_gives_a_clear_error_and_no_run(remote, store, sshd):
    settings, workdir = remote
    port = free_port()  # nothing listens there
    down = Settings(ssh_hosts={"testhost": settings.ssh_hosts["testhost"].model_copy(update={"port": port})})
    with pytest.raises(LaunchError, match=rf"^ssh host 'testhost': host {sshd.user}@127\.0\.0\.1:{port} is unreachable"):
        launch(load_recipe("grpo", ["train.steps=2"]), target="ssh://testhost", principal=local_principal(), store=store, settings=down)
    assert store.list_runs().empty
    # an unreachable host makes liveness unknown (None), never "dead": the store must not mark it lost
    fake = {"id": "x", "handle": {"remote_dir": str(workdir), "pgid": 1}}
    assert launcher_for("ssh://testhost", down).alive(fake) is None
    with pytest.raises(LaunchError, match="unreachable"):
        launcher_for("ssh://testhost", down).read_events({**fake, "events_offset": 0})


def test_follower_resumes_at_the_ingested_byte_offset(remote, tmp_path):
    """Byte-exact streaming: a torn last line waits, the follower delivers appended lines, and after
    its connection is killed the next read resumes at the given offset with no gap or repeat."""
    settings, _ = remote
    remote_dir = tmp_path / "fake_run"
    remote_dir.mkdir()
    events = remote_dir / "events.jsonl"
    lines = [json.dumps({"kind": "metrics", "step": s, "time": 1.0, "metrics": {"reward": s / 10}}) + "\n" for s in range(6)]
    events.write_text(lines[0] + lines[1] + lines[2][:7])  # step 2 torn mid-write
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)  # the "run": its own process group
    run = {"id": "fake-run", "status": "running", "run_dir": None,
           "handle": {"remote_dir": str(remote_dir), "pgid": sleeper.pid}, "events_offset": 0}
    launcher = launcher_for("ssh://testhost", settings)
    try:
        chunk = launcher.read_events(run)
        assert [e["step"] for e in chunk.events] == [0, 1]
        assert chunk.offset == len(lines[0]) + len(lines[1])
        run["events_offset"] = chunk.offset
        first = ssh.follower_pid("fake-run")
        assert first is not None
        with open(events, "a") as f:
            f.write(lines[2][7:] + lines[3])
        got = _read_until(launcher, run, 2)
        assert [e["step"] for e in got] == [2, 3]
        assert ssh.follower_pid("fake-run") == first  # served by the live stream, not a new connection
        os.kill(first, signal.SIGKILL)
        with open(events, "a") as f:
            f.write(lines[4] + lines[5])
        got = _read_until(launcher, run, 2)
        assert [e["step"] for e in got] == [4, 5]
        assert run["events_offset"] == len("".join(lines))
        # a reader that is behind the follower (e.g. another collector won the race) re-reads from its offset
        stale = {**run, "events_offset": len(lines[0])}
        assert [e["step"] for e in launcher.read_events(stale).events] == [1, 2, 3, 4, 5]
    finally:
        sleeper.kill()
        sleeper.wait()
        ssh.stop_followers()


def _read_until(launcher, run, n, timeout=30.0):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        chunk = launcher.read_events(run)
        got += chunk.events
        run["events_offset"] = chunk.offset
        time.sleep(0.1)
    return got


@pytest.mark.parametrize("field,value,expected", [
    ("hostname", "-oProxyCommand=touch /tmp/pwned", "hostname='-oProxyCommand=touch /tmp/pwned' is not allowed"),
    ("hostname", "gpu1;id", "hostname='gpu1;id' is not allowed"),
    ("hostname", "gpu1 $(id)", "hostname='gpu1 $(id)' is not allowed; use letters, digits"),
    ("user", "root$(id)", "user='root$(id)' is not allowed; use a POSIX user name"),
    ("user", "-l", "user='-l' is not allowed"),
    ("port", 0, "port=0: Input should be greater than or equal to 1"),
    ("workdir", "/tmp/a\nrm -rf ~", "workdir='/tmp/a\\nrm -rf ~' is not allowed; a non-empty single-line path"),
    ("workdir", "~bob/wb", "workdir='~bob/wb' is not allowed; '~' is only expanded as a leading '~/'"),
    ("python", "", "python='' is not allowed"),
    ("known_hosts", "/tmp/a b", "known_hosts='/tmp/a b' is not allowed; a path without whitespace"),
    ("identity_file", "/k\n-oProxyCommand=x", "identity_file='/k\\n-oProxyCommand=x' is not allowed"),
    ("setup", "true\0", "setup='true\\x00' is not allowed; shell text without NUL bytes"),
    ("strict_host_key_checking", None, "strict_host_key_checking=None: Input should be a valid boolean"),
])
def test_hostile_host_settings_are_rejected_by_field(field, value, expected):
    # model_construct skips the settings' own validation: the launcher must not rely on it
    host = SSHHost.model_construct(**{**SSHHost(hostname="h").model_dump(), field: value})
    settings = Settings.model_construct(ssh_hosts={"evil": host})
    with pytest.raises(LaunchError) as err:
        launcher_for("ssh://evil", settings)
    assert str(err.value).startswith("ssh host 'evil': ") and expected in str(err.value)


def test_host_key_checking_is_strict_unless_turned_off():
    """A host entry that does not mention strict_host_key_checking (a plain dict too) is strict."""
    def checking(entry):
        host = ssh.host_config("ssh://h", SimpleNamespace(ssh_hosts={"h": entry}))
        return next(a for a in ssh.ssh_argv(host, "true") if a.startswith("StrictHostKeyChecking="))

    assert checking({"hostname": "gpu1"}) == "StrictHostKeyChecking=yes"
    assert checking(SSHHost(hostname="gpu1")) == "StrictHostKeyChecking=yes"
    assert checking({"hostname": "gpu1", "strict_host_key_checking": False}) == "StrictHostKeyChecking=accept-new"
    # the collector checks an ssh run's liveness at most every 5 s (each check is an ssh connection)
    assert ssh.SSHLauncher.alive_every_s == 5


@pytest.mark.parametrize("target,expected", [
    ("ssh://a;b", "target='ssh://a;b' is not allowed; use ssh://NAME"),
    ("ssh://../x", "target='ssh://../x' is not allowed"),
    ("ssh://nohost", "unknown ssh host 'nohost' in target='ssh://nohost'; hosts in settings: gpu1"),
])
def test_hostile_or_unknown_target_names(target, expected):
    settings = Settings(ssh_hosts={"gpu1": SSHHost(hostname="gpu1.example.org")})
    with pytest.raises(LaunchError) as err:
        launcher_for(target, settings)
    assert expected in str(err.value)


def test_settings_reject_metacharacters_in_hostname_and_user():
    with pytest.raises(ValueError, match="hostname='h;id' is not allowed"):
        SSHHost(hostname="h;id")
    with pytest.raises(ValueError, match=r"user='a\$\(id\)' is not allowed"):
        SSHHost(hostname="h", user="a$(id)")


def test_metacharacters_in_workdir_are_quoted_not_run(remote, tmp_path):
    """workdir and python are quoted: `$(...)`, backticks, ';' and spaces stay literal path text."""
    settings, _ = remote
    marker = tmp_path / "pwned"
    workdir = tmp_path / f"w $(touch {marker}) `touch {marker}`;touch {marker}"
    host = settings.ssh_hosts["testhost"].model_copy(update={"workdir": str(workdir), "python": "/bin/true"})
    launcher = launcher_for("ssh://testhost", Settings(ssh_hosts={"testhost": host}))
    run = {"id": "quoted-1", "recipe": "name: grpo\n", "launch": {}, "run_dir": None}
    handle = launcher.start(run)
    assert handle["remote_dir"] == f"{workdir}/runs/quoted-1"
    assert (workdir / "runs" / "quoted-1" / "recipe.yaml").read_text() == "name: grpo\n"
    _wait_for_file(workdir / "runs" / "quoted-1" / "exit_code")
    assert (workdir / "runs" / "quoted-1" / "exit_code").read_text() == "0\n"  # /bin/true ran as "python"
    assert not marker.exists()
    # the same run id cannot be started twice over an existing remote directory
    with pytest.raises(LaunchError, match="remote command failed"):
        launcher.start(run)


def test_start_without_an_answer_says_where_the_run_may_be(remote):
    """ssh gives up while starting (the run may be going on there): the error names the run and its remote dir."""
    settings, workdir = remote
    launcher = launcher_for("ssh://testhost", settings)
    launcher.command_timeout = 0.001  # far shorter than any ssh handshake: no answer arrives
    with pytest.raises(LaunchError) as err:
        launcher.start({"id": "late-1", "recipe": "name: grpo\n", "launch": {}, "run_dir": None})
    remote_dir = workdir / "runs" / "late-1"
    assert str(err.value) == (
        f"ssh host 'testhost' ({launcher.host.address}): no answer within 0.001 s while starting run late-1; "
        f"run late-1 may have started anyway in {remote_dir} on ssh host 'testhost'; "
        f"end it there with `kill -TERM -$(cat {remote_dir}/pgid)`")


def _wait_for_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), path


def test_failing_setup_line_is_reported(remote, store):
    settings, workdir = remote
    host = settings.ssh_hosts["testhost"].model_copy(update={"setup": "source /nonexistent/venv/bin/activate"})
    bad = Settings(ssh_hosts={"testhost": host})
    run_id = launch(load_recipe("grpo", ["train.steps=2"]), target="ssh://testhost", principal=local_principal(), store=store, settings=bad)
    assert wait(run_id, store=store, settings=bad, poll_s=0.2, timeout_s=60) == "failed"
    run = store.get_run(run_id)
    assert run["error"] == (f"the setup line of ssh host 'testhost' failed; see {run['handle']['remote_dir']}/stdout.log")
    assert "/nonexistent/venv/bin/activate: No such file or directory" in launcher_for("ssh://testhost", bad).log_tail(run)
