"""Runs on a remote host over SSH: the system OpenSSH client, the user's own keys and known_hosts.

Target ``ssh://NAME`` names an entry of ``Settings.ssh_hosts``. On the host, a run lives in
``WORKDIR/runs/RUN_ID/``::

    recipe.yaml    uploaded over ssh's stdin at start
    run.sh         the wrapper: records its pid, runs the host's ``setup`` line, then the trainer
    pgid           the wrapper's pid = its process group (it is a session leader via ``setsid``)
    stdout.log     everything the set-up and the trainer print (every attempt's, appended)
    events.jsonl   the engine's event stream (what :meth:`SSHLauncher.read_events` streams back)
    exit_code      the trainer's exit status, written by the wrapper when the trainer ends
    checkpoints/   the trainer's checkpoints (``checkpoint.every``)

A resume (``runs resume``) starts a new wrapper with ``train --resume`` in the same directory: the
trainer continues from the newest checkpoint there and appends to the same events.jsonl, so the
store goes on reading it from the byte offset it had ingested (the ``resume`` event first).

The wrapper runs under ``setsid nohup`` with every stream redirected, so it survives the SSH
connection that started it, an app restart and a dropped link. Events are read by byte offset
(``tail -c +N``), so after a drop the next read resumes exactly where the store's last ingest
ended; a long-lived ``ssh ... tail -F`` follower per run cuts the latency between polls and is
simply restarted from the stored offset when its connection dies.

Trust and quoting (hostile-input rules):
- ``BatchMode=yes`` (never a password or passphrase prompt), ``StrictHostKeyChecking=yes``: a host
  whose key is not already in known_hosts is refused with instructions to add it. Only a host whose
  settings turn ``strict_host_key_checking`` off gets ``accept-new`` (new keys are recorded, a
  *changed* key is still refused).
- ``hostname`` and ``user`` must match strict patterns (they become ssh arguments; a leading '-'
  could be read as an option). ``workdir`` and ``python`` are quoted with ``shlex.quote`` (a
  leading ``~/`` becomes ``"$HOME"/``). Every remote command is a ``sh -c`` script whose variable
  parts are quoted, so the user's login shell only ever parses ``sh -c '<quoted>'``.
- ``setup`` is an administrator-written shell line (e.g. ``source ~/venv/bin/activate``): it is run
  as-is on the remote host by design. It comes only from the settings file, never from a launch form.
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

from pydantic import ConfigDict, ValidationError, field_validator

from workbench.engine.checkpoint import CHECKPOINTS_DIR, STATE_FILE  # torch-free
from workbench.export.commands import ShellVar, shell_join, train_command
from workbench.recipe import format_validation_error
from workbench.runs.launchers.base import (EVENTS_FILE, EXIT_CODE_FILE, LAUNCHERS, STDOUT_FILE, ConfigError, EventChunk,
                                           LaunchError, Launcher, mirror_events, parse_events,
                                           status_from_exit_code)
from workbench.runs.settings import _NAME_PATTERN as NAME_PATTERN  # ssh host names (and safe run ids)
from workbench.runs.settings import SSHHost
from workbench.runs.store import TERMINAL_STATUSES

SETUP_FAILED_CODE = 97  # exit_code written when the host's setup line fails (trainer never started)

# Remote shell helper: is any process of group $1 still running? Zombies do not count: where init
# does not reap orphans (containers, microVMs), a finished wrapper lingers as a zombie and
# `kill -0` alone would report it alive forever. Without `ps`, fall back to `kill -0 -PGID`.
_ALIVE_FN = (
    "wb_alive() { if command -v ps >/dev/null 2>&1; then "
    "ps -A -o pgid= -o stat= | awk -v g=\"$1\" '$1 == g && $2 !~ /^Z/ {n++} END {exit !n}'; "
    "else kill -0 -\"$1\" 2>/dev/null; fi; }"
)


# -- the host entry and quoting ---------------------------------------------------------------------
def remote_path_word(path: str) -> str:
    """A remote path as one shell word: quoted, except that a leading ``~`` / ``~/`` is ``"$HOME"``.

    ``~/wb dir/$(x)`` -> ``"$HOME"/'wb dir/$(x)'`` (the remote shell expands only ``$HOME``).
    """
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


class HostConfig(SSHHost):
    """One checked ssh host entry: the settings' SSHHost (hostname and user patterns, port range,
    single-line paths, strict host key checking by default), plus the rules of how this launcher
    uses the values. hostname and user become ssh arguments (SSHHost's strict patterns); remote
    paths are quoted, so any single line is fine, with '~' expanded only as a leading '~/'."""

    model_config = ConfigDict(frozen=True)

    name: str
    """The NAME of ``ssh://NAME`` (a key of Settings.ssh_hosts)."""

    @field_validator("workdir", "python")
    @classmethod
    def _tilde(cls, value: str, info) -> str:
        if value.startswith("~") and not (value == "~" or value.startswith("~/")):
            raise ValueError(f"{info.field_name}={value!r} is not allowed; '~' is only expanded as a leading '~/' (no '~user')")
        return value

    @field_validator("known_hosts")
    @classmethod
    def _one_word(cls, value: str | None) -> str | None:
        # it goes into `-o UserKnownHostsFile=`, which ssh splits on whitespace
        if value is not None and not re.fullmatch(r"[^\s\0]+", value):
            raise ValueError(f"known_hosts={value!r} is not allowed; a path without whitespace")
        return value

    @field_validator("identity_file")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c in value for c in "\n\r\0")):
            raise ValueError(f"identity_file={value!r} is not allowed; a non-empty single-line path")
        return value

    @field_validator("setup")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        # run as-is by design (admin-written), but no argv can carry a NUL byte
        if "\0" in value:
            raise ValueError(f"setup={value!r} is not allowed; shell text without NUL bytes")
        return value

    @property
    def address(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.hostname}:{self.port}"


def host_config(target: str, settings) -> HostConfig:
    """The checked host entry of ``ssh://NAME``; ConfigError naming the field for anything unsafe.

    The entry is validated here even when the settings already were: settings objects built with
    ``model_construct`` or plain dicts skip their own checks, and these values reach ssh and a shell.
    """
    name = target.split("://", 1)[1] if "://" in target else ""
    hosts = dict(getattr(settings, "ssh_hosts", None) or {})
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"target={target!r} is not allowed; use ssh://NAME with NAME one of the ssh hosts in "
                          f"settings: {', '.join(sorted(hosts)) or '(none configured)'}")
    if name not in hosts:
        raise ConfigError(f"unknown ssh host {name!r} in target={target!r}; hosts in settings: "
                          f"{', '.join(sorted(hosts)) or '(none configured; add one under ssh_hosts in settings.yaml)'}")
    host = hosts[name]
    values = host.model_dump(warnings=False) if isinstance(host, SSHHost) else dict(host)
    try:
        return HostConfig.model_validate({**values, "name": name})
    except ValidationError as err:
        problems = format_validation_error(err, HostConfig).split("\n", 1)[1].strip()
        raise ConfigError(f"ssh host {name!r}: {problems}") from None


def ssh_argv(host: HostConfig, remote_script: str, *, connect_timeout: int = 10) -> list[str]:
    """argv of ``ssh`` running ``sh -c REMOTE_SCRIPT`` on the host (no local shell anywhere)."""
    argv = ["ssh", "-T", "-o", "BatchMode=yes",
            "-o", f"StrictHostKeyChecking={'yes' if host.strict_host_key_checking else 'accept-new'}",
            "-o", f"ConnectTimeout={connect_timeout}", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-o", "LogLevel=ERROR", "-p", str(host.port)]
    if host.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={os.path.expanduser(host.known_hosts)}"]
    if host.identity_file:
        argv += ["-i", os.path.expanduser(host.identity_file), "-o", "IdentitiesOnly=yes"]
    if host.user:
        argv += ["-l", host.user]
    return argv + ["--", host.hostname, "sh -c " + shlex.quote(remote_script)]


class _NoAnswer(LaunchError):
    """ssh did not finish in time: the remote command may still have run (or be running)."""


# -- ssh failures -> clear errors ------------------------------------------------------------------
def _known_hosts_hint(host: HostConfig) -> str:
    file = host.known_hosts or "~/.ssh/known_hosts"
    return (f"add it after checking its fingerprint: `ssh-keyscan -p {host.port} {host.hostname} >> {file}`, then compare "
            f"`ssh-keygen -lf {file}` with the fingerprint the host's administrator gives you "
            f"(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the host)")


# (pattern in ssh's stderr, message) in order: the first match explains the failure
_SSH_FAILURES: tuple[tuple[re.Pattern, Callable[[HostConfig], str]], ...] = (
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for .* has changed", re.I),
     lambda h: f"the host key of {h.hostname}:{h.port} differs from the one in {h.known_hosts or '~/.ssh/known_hosts'} "
               "(possible man-in-the-middle, or the host was reinstalled); refusing to connect. Ask the host's "
               "administrator, then remove the old key with `ssh-keygen -R` and add the new one"),
    (re.compile(r"host key is known for|Host key verification failed", re.I),
     lambda h: f"the host key of {h.hostname}:{h.port} is not in known_hosts "
               f"({h.known_hosts or '~/.ssh/known_hosts'}) and host keys are never accepted automatically; "
               + _known_hosts_hint(h)),
    (re.compile(r"Could not resolve hostname", re.I),
     lambda h: f"cannot resolve hostname {h.hostname!r}; check ssh_hosts.{h.name}.hostname in settings"),
    (re.compile(r"Connection refused|Connection timed out|timed out|No route to host|Network is unreachable|"
                r"Connection reset|Connection closed|kex_exchange_identification", re.I),
     lambda h: f"host {h.address} is unreachable (no SSH server answering there); check that it is up, "
               f"and ssh_hosts.{h.name}.hostname / port in settings"),
    (re.compile(r"Permission denied|Too many authentication failures", re.I),
     lambda h: f"{h.address} refused the key (BatchMode: no passwords); check ssh_hosts.{h.name}.user and "
               f"identity_file ({h.identity_file or 'ssh-agent / ~/.ssh defaults'}) and the host's authorized_keys"),
)


def explain_ssh_failure(host: HostConfig, stderr: str) -> str:
    """A clear sentence for ssh's exit status 255 from its stderr."""
    for pattern, message in _SSH_FAILURES:
        if pattern.search(stderr):
            return f"ssh host {host.name!r}: {message(host)}"
    return f"ssh host {host.name!r} ({host.address}): ssh failed: {stderr.strip()[-500:] or 'no message'}"


# -- remote scripts (pure text; every variable part quoted) ------------------------------------------
def _detach_lines(run_sh: str) -> list[str]:
    """In the run dir: write run.sh, start it detached, wait for its pgid; print the dir and the pgid."""
    return [
        f"printf '%s\\n' {shlex.quote(run_sh)} > run.sh",
        "sh_=$(command -v bash || command -v sh)",  # bash when present: setup lines often use `source`
        'setsid nohup "$sh_" run.sh < /dev/null > /dev/null 2>&1 &',
        "i=0",
        "while [ ! -s pgid ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done",
        "[ -s pgid ] || { echo 'the run wrapper did not start; see stdout.log' >&2; exit 3; }",
        "pwd",
        "cat pgid",
    ]


def start_script(run_dir_word: str, runs_root_word: str, run_sh: str) -> str:
    """Create the run dir (fails if it exists), store stdin as recipe.yaml, start the wrapper detached.

    Prints the absolute run dir and the wrapper's pgid on two lines.
    """
    return "\n".join([
        "set -e",
        f"mkdir -p -- {runs_root_word}",
        f"mkdir -- {run_dir_word}",  # fails if it exists: a run id is started once
        f"cd -- {run_dir_word}",
        "cat > recipe.yaml",
        *_detach_lines(run_sh),
    ])


RESUME_REFUSED_CODE = 4  # resume_script: the remote dir is no run dir, or the attempt before still runs


def resume_script(run_dir_word: str, run_sh: str) -> str:
    """Start a new wrapper (``run_sh``: ``train --resume``) in an existing run dir, keeping its
    recipe.yaml, events.jsonl, stdout.log and checkpoints; refused (exit ``RESUME_REFUSED_CODE``,
    why on stderr) where there is no run or its previous wrapper's group still has processes.

    Prints the absolute run dir and the new wrapper's pgid on two lines.
    """
    refuse = f"exit {RESUME_REFUSED_CODE}"
    return "\n".join([
        "set -e",
        _ALIVE_FN,
        f"cd -- {run_dir_word} 2>/dev/null || {{ echo no run directory {run_dir_word} >&2; {refuse}; }}",
        f"[ -f recipe.yaml ] || {{ echo \"$(pwd) has no recipe.yaml\" >&2; {refuse}; }}",
        # the attempt before must be over: two trainers must never append to one events.jsonl
        f"if [ -s pgid ] && wb_alive \"$(cat pgid)\"; then echo \"process group $(cat pgid) of the run is still "
        f"running\" >&2; {refuse}; fi",
        f"rm -f pgid {EXIT_CODE_FILE}",
        *_detach_lines(run_sh),
    ])


def wrapper_script(setup: str, python_word: str, train_words: str) -> str:
    """run.sh: the run's process-group leader. ``setup`` is the admin's line, run as-is.

    ``train_words`` may use ``$WB_RUN_DIR`` (the run dir), ``$WB_RECIPE`` (its recipe.yaml) and
    ``$WB_PYTHON`` (``python_word``, set after the setup line so that it cannot change it).
    """
    # >>: a resumed attempt keeps the output of the attempts before it
    lines = ["echo $$ > pgid", f"exec >> {STDOUT_FILE} 2>&1 < /dev/null", "export PYTHONUNBUFFERED=1"]
    if setup.strip():
        lines += ["# host setup line (from the workbench settings, run as-is):", setup,
                  f"rc=$?; if [ $rc -ne 0 ]; then echo \"workbench: the host's setup line failed (exit $rc)\"; "
                  f"echo {SETUP_FAILED_CODE} > {EXIT_CODE_FILE}; exit {SETUP_FAILED_CODE}; fi",
                  'cd -- "$WB_RUN_DIR"']  # the setup line may have changed directory
    lines += [f"WB_PYTHON={python_word}", 'WB_RECIPE="$WB_RUN_DIR"/recipe.yaml', train_words,
              f"echo $? > {EXIT_CODE_FILE}"]
    return "\n".join(["WB_RUN_DIR=$(pwd)", *lines])


def alive_script(pgid: int) -> str:
    return f"{_ALIVE_FN}\nif wb_alive {int(pgid)}; then echo alive; else echo dead; fi"


def cancel_script(pgid: int, grace_s: float) -> str:
    """SIGTERM to the group, SIGKILL if anything is still running after ``grace_s``."""
    g, ticks = int(pgid), max(1, int(grace_s * 10))
    return "\n".join([
        _ALIVE_FN,
        f"wb_alive {g} || {{ echo gone; exit 0; }}",
        f"kill -TERM -{g} 2>/dev/null",
        "i=0",
        f"while wb_alive {g}; do",
        f"  if [ $i -ge {ticks} ]; then kill -KILL -{g} 2>/dev/null; echo killed; exit 0; fi",
        "  sleep 0.1; i=$((i + 1))",
        "done",
        "echo terminated",
    ])


def read_script(run_dir: str, offset: int) -> str:
    """Bytes of events.jsonl from ``offset`` (nothing while the file does not exist yet)."""
    d = shlex.quote(run_dir)
    return f"cd -- {d} || exit 3\nif [ -f {EVENTS_FILE} ]; then exec tail -c +{int(offset) + 1} -- {EVENTS_FILE}; fi"


def follow_script(run_dir: str, offset: int, pgid: int) -> str:
    """Stream events.jsonl from ``offset`` while the run lives; ends ~1 s after the run does.

    Exits at once (status 3) while the file does not exist yet, so the caller polls until it does.
    """
    d = shlex.quote(run_dir)
    return "\n".join([
        _ALIVE_FN,
        f"cd -- {d} || exit 3",
        f"[ -f {EVENTS_FILE} ] || exit 3",
        f"tail -c +{int(offset) + 1} -F -- {EVENTS_FILE} 2>/dev/null & t=$!",
        f"while wb_alive {int(pgid)}; do sleep 1; done",
        "sleep 1",  # let tail pass on the last lines
        "kill $t 2>/dev/null",
    ])


def checkpoints_script(run_dir: str) -> str:
    """Names of the complete checkpoints (their trainer_state.json exists) of a run dir, one a line."""
    d = remote_path_word(run_dir)  # "~/..." where no attempt has recorded its absolute dir yet
    return "\n".join([
        f"cd -- {d} || exit 3",
        f"for c in {CHECKPOINTS_DIR}/step-*; do [ -f \"$c/{STATE_FILE}\" ] && echo \"${{c#{CHECKPOINTS_DIR}/}}\"; done",
        "true",
    ])


def newest_checkpoint_name(listing: str) -> tuple[int, str] | None:
    """(step, name) of the newest ``step-NNNNNNNN`` name in ``checkpoints_script``'s output, or None."""
    steps = [(int(name[len("step-"):]), name) for name in listing.split()
             if name.startswith("step-") and name[len("step-"):].isdigit()]
    return max(steps) if steps else None


def log_script(run_dir: str, max_bytes: int) -> str:
    d = shlex.quote(run_dir)
    return f"cd -- {d} || exit 3\nif [ -f {STDOUT_FILE} ]; then exec tail -c {int(max_bytes)} -- {STDOUT_FILE}; fi"


# -- followers: one long-lived `ssh ... tail -F` per run, shared by every launcher object -------------
@dataclass
class _Follower:
    """Bytes of the remote events.jsonl from ``base`` on, as they arrive (``buf`` holds base..)."""

    proc: subprocess.Popen
    base: int
    buf: bytearray = field(default_factory=bytearray)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pump(self) -> None:  # reader thread
        fd = self.proc.stdout.fileno()
        while True:
            data = os.read(fd, 65536)
            if not data:
                return
            with self.lock:
                self.buf += data

    def take(self, offset: int) -> bytes | None:
        """Bytes from ``offset`` (dropping those before it); None if ``offset`` is outside the buffer."""
        with self.lock:
            if not self.base <= offset <= self.base + len(self.buf):
                return None
            del self.buf[: offset - self.base]
            self.base = offset
            return bytes(self.buf)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


_followers: dict[str, _Follower] = {}
_followers_lock = threading.Lock()


def _stop_follower(run_id: str) -> None:
    with _followers_lock:
        follower = _followers.pop(run_id, None)
    if follower is not None:
        follower.stop()


def _reap_finished_followers() -> None:
    """Forget followers whose stream ended (their run ended, or the link dropped): no zombie ssh clients."""
    for run_id, follower in list(_followers.items()):
        if follower.proc.poll() is not None:
            _stop_follower(run_id)


@atexit.register
def stop_followers() -> None:
    """End every follower of this process (they would otherwise outlive it until their run ends)."""
    for run_id in list(_followers):
        _stop_follower(run_id)


def follower_pid(run_id: str) -> int | None:
    """Local pid of the ssh client following a run's events (None if there is none)."""
    follower = _followers.get(run_id)
    return follower.proc.pid if follower is not None and follower.proc.poll() is None else None


# -- the launcher ---------------------------------------------------------------------------------
@LAUNCHERS.register("ssh")
class SSHLauncher(Launcher):
    """``accelerate launch -m workbench train`` on an SSH host, detached with ``setsid nohup``."""

    scheme = "ssh"
    target_help = "ssh://HOST (a host in settings)"
    alive_every_s = 5.0  # each check is an ssh connection (a handshake), not a /proc read
    connect_timeout = 10  # seconds for ssh to reach the host
    command_timeout = 60  # seconds for a short remote command (start, alive, read)
    follow = True  # keep a `tail -F` stream open per active run between reads

    @classmethod
    def offered_targets(cls, settings) -> dict[str, str]:
        return {f"ssh://{name}": f"ssh://{name}" for name in getattr(settings, "ssh_hosts", None) or {}}

    def __init__(self, target: str, settings) -> None:
        super().__init__(target, settings)
        self.host = host_config(target, settings)  # unknown / hostile host entry -> ConfigError now

    # ssh plumbing
    def _ssh(self, script: str, *, stdin: bytes | None = None, timeout: float | None = None) -> bytes:
        """Run ``script`` on the host; its stdout. LaunchError (explained) if ssh itself fails."""
        argv = ssh_argv(self.host, script, connect_timeout=self.connect_timeout)
        try:
            proc = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                                  timeout=timeout or self.command_timeout)
        except subprocess.TimeoutExpired:
            raise _NoAnswer(f"ssh host {self.host.name!r} ({self.host.address}): no answer within "
                            f"{timeout or self.command_timeout} s") from None
        except OSError as err:
            raise LaunchError(f"cannot run the ssh client ({err}); install OpenSSH's `ssh`") from err
        stderr = proc.stderr.decode(errors="replace")
        if proc.returncode == 255:
            raise LaunchError(explain_ssh_failure(self.host, stderr))
        if proc.returncode != 0:
            raise LaunchError(f"ssh host {self.host.name!r}: remote command failed (exit {proc.returncode}): "
                              f"{stderr.strip()[-800:]}")
        return proc.stdout

    def _handle(self, run: dict) -> tuple[str, int]:
        handle = run.get("handle") or {}
        try:
            return str(handle["remote_dir"]), int(handle["pgid"])
        except (KeyError, TypeError, ValueError):
            raise LaunchError(f"run {run.get('id')!r} has no ssh handle (remote_dir, pgid); was it started?") from None

    # Launcher interface
    def train_words(self, run: dict) -> str:
        """The remote trainer command as shell text over the wrapper's $WB_PYTHON, $WB_RECIPE, $WB_RUN_DIR
        (``train --resume "$WB_RUN_DIR"`` for a resumed run)."""
        launch = run.get("launch") or {}
        # No --cpu: the host trains on what it has (accelerate uses its GPUs, or the CPU where there are none).
        argv = train_command(ShellVar("WB_RECIPE"), ShellVar("WB_RUN_DIR"), python=ShellVar("WB_PYTHON"),
                             stdout_events=True, num_processes=int(launch.get("num_processes", 1)), cpu=False,
                             mixed_precision=str(launch.get("mixed_precision", "no")), resume=bool(launch.get("resume")))
        return shell_join(argv)

    def remote_dir(self, run: dict) -> str:
        """Where the run lives on the host: the directory its attempt before ran in (a resume; the
        host's workdir may have changed in the settings since), else ``WORKDIR/runs/RUN_ID``."""
        run_id = str(run["id"])
        if not NAME_PATTERN.match(run_id) or ".." in run_id:
            raise LaunchError(f"run id={run_id!r} is not allowed as a remote directory name")
        launch = run.get("launch") or {}
        previous = (launch.get("previous_handle") or {}).get("remote_dir") if launch.get("resume") else None
        return str(previous) if previous else f"{self.host.workdir.rstrip('/') or ''}/runs/{run_id}"

    def start(self, run: dict) -> dict:
        run_id = str(run["id"])
        remote = self.remote_dir(run)
        run_sh = wrapper_script(self.host.setup, remote_path_word(self.host.python), self.train_words(run))
        resuming = bool((run.get("launch") or {}).get("resume"))
        if resuming:
            _stop_follower(run_id)  # a stream of the attempt before (its pgid) must not serve this one
            script, stdin = resume_script(remote_path_word(remote), run_sh), b""
        else:
            recipe = run.get("recipe")
            if recipe is None:
                recipe = (Path(run["run_dir"]) / "recipe.yaml").read_text()
            script = start_script(remote_path_word(remote), remote_path_word(remote.rsplit("/", 1)[0] or "/"), run_sh)
            stdin = recipe.encode()
        # A start that fails after the remote side began may leave a running run behind, while the
        # caller drops it locally: such errors say where it is and how to end it.
        may_run = (f"run {run_id} may have started anyway in {remote} on ssh host {self.host.name!r}; "
                   f"end it there with `kill -TERM -$(cat {remote_path_word(remote + '/pgid')})`")
        try:
            out = self._ssh(script, stdin=stdin).decode().strip().splitlines()
        except _NoAnswer as err:
            raise LaunchError(f"{err} while {'resuming' if resuming else 'starting'} run {run_id}; {may_run}") from None
        try:
            remote_dir, pgid = out[-2], int(out[-1])
        except (IndexError, ValueError):
            raise LaunchError(f"ssh host {self.host.name!r}: unexpected answer when starting the run: {out!r}; "
                              f"{may_run}") from None
        return {"host": self.host.name, "remote_dir": remote_dir, "pgid": pgid, "pid": pgid,
                "events_file": f"{remote_dir}/{EVENTS_FILE}"}

    def alive(self, run: dict) -> bool | None:
        """Whether the remote run's process group has a running process; None if the host is unreachable.
        False for a run without a process group (never started, or its resume failed to start)."""
        if not (run.get("handle") or {}).get("pgid"):
            return False
        remote_dir, pgid = self._handle(run)
        try:
            answer = self._ssh(alive_script(pgid)).decode().strip()
        except LaunchError:
            return None  # a network blink must not make the store declare the run lost
        if answer not in ("alive", "dead"):
            return None
        if answer == "dead":
            _stop_follower(str(run["id"]))  # the next read fetches the final lines in one go
        return answer == "alive"

    def cancel(self, run: dict, grace_s: float = 10.0) -> None:
        _, pgid = self._handle(run)
        self._ssh(cancel_script(pgid, grace_s), timeout=grace_s + self.command_timeout)

    def read_events(self, run: dict) -> EventChunk:
        """New complete events since ``run['events_offset']``; LaunchError while the host is unreachable."""
        run_id = str(run["id"])
        offset = int(run.get("events_offset") or 0)
        follower = _followers.get(run_id)
        data = follower.take(offset) if follower is not None and follower.proc.poll() is None else None
        _reap_finished_followers()
        if data is None:
            _stop_follower(run_id)  # dead (link dropped) or out of step with the store: resume from the offset
            remote_dir, _ = self._handle(run)
            data = self._ssh(read_script(remote_dir, offset))
        chunk = parse_events(data, offset)
        mirror_events(run, offset, data[: chunk.offset - offset])
        if self.follow and run_id not in _followers and run.get("status") not in TERMINAL_STATUSES:
            self._start_follower(run, chunk.offset)
        return chunk

    def exit_status(self, run: dict) -> tuple[str | None, str | None]:
        """After the remote process is gone: (status, error) from the wrapper's exit code, if any."""
        remote_dir, _ = self._handle(run)
        text = self._ssh(f"cat -- {shlex.quote(remote_dir)}/{EXIT_CODE_FILE} 2>/dev/null || true").decode().strip()
        try:
            code = int(text)
        except ValueError:
            return None, None  # the wrapper itself was killed
        if code == SETUP_FAILED_CODE:
            return "failed", f"the setup line of ssh host {self.host.name!r} failed; see {remote_dir}/{STDOUT_FILE}"
        # the log is on the host: name it rather than read its last line
        return status_from_exit_code(code, None, f"remote trainer on ssh host {self.host.name!r} "
                                                 f"(log: {remote_dir}/{STDOUT_FILE})")

    def latest_checkpoint(self, run: dict) -> tuple[int, PurePosixPath] | None:
        """(step, path on the host) of the newest complete checkpoint in the run's remote dir, or None."""
        remote_dir = (run.get("handle") or {}).get("remote_dir") or self.remote_dir(run)
        newest = newest_checkpoint_name(self._ssh(checkpoints_script(remote_dir)).decode(errors="replace"))
        return None if newest is None else (newest[0], PurePosixPath(remote_dir, CHECKPOINTS_DIR, newest[1]))

    def check_host(self) -> str:
        """Connect, run the host's setup line and import the workbench with its python ("Test connection").

        Returns the remote python's version and workbench path; LaunchError saying what is wrong.
        """
        probe = "import sys, workbench; print(sys.version.split()[0], workbench.__file__)"
        script = "\n".join([self.host.setup, f"exec {remote_path_word(self.host.python)} -c {shlex.quote(probe)}"])
        return self._ssh(script).decode().strip()

    def log_tail(self, run: dict, max_bytes: int = 65536) -> str:
        """The last ``max_bytes`` of the remote stdout.log (set-up and trainer output)."""
        remote_dir, _ = self._handle(run)
        return self._ssh(log_script(remote_dir, max_bytes)).decode(errors="replace")

    # helpers
    def _start_follower(self, run: dict, offset: int) -> None:
        remote_dir, pgid = self._handle(run)
        argv = ssh_argv(self.host, follow_script(remote_dir, offset, pgid), connect_timeout=self.connect_timeout)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            return  # polling still works
        follower = _Follower(proc, offset)
        threading.Thread(target=follower.pump, daemon=True, name=f"ssh-follow:{run['id']}").start()
        with _followers_lock:
            previous = _followers.pop(str(run["id"]), None)
            _followers[str(run["id"])] = follower
        if previous is not None:
            previous.stop()
