"""Runs on a remote host over SSH: the system OpenSSH client, the user's own keys and known_hosts.

Target ``ssh://NAME`` names an entry of ``Settings.ssh_hosts``. On the host, a run lives in
``WORKDIR/runs/RUN_ID/``::

    recipe.yaml    uploaded over ssh's stdin at start
    run.sh         the wrapper: records its pid, runs the host's ``setup`` line, then the trainer
    pgid           the wrapper's pid = its process group (it is a session leader via ``setsid``)
    stdout.log     everything the set-up and the trainer print
    events.jsonl   the engine's event stream (what :meth:`SSHLauncher.read_events` streams back)
    exit_code      the trainer's exit status, written by the wrapper when the trainer ends

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
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from workbench.export.commands import shell_join, train_command
from workbench.runs.launchers.base import LAUNCHERS, EventChunk, LaunchError, Launcher, parse_events
from workbench.runs.store import TERMINAL_STATUSES

EVENTS_FILE = "events.jsonl"
STDOUT_FILE = "stdout.log"
EXIT_CODE_FILE = "exit_code"
SETUP_FAILED_CODE = 97  # exit_code written when the host's setup line fails (trainer never started)

_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # the NAME in ssh://NAME
_HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$")

# Remote shell helper: is any process of group $1 still running? Zombies do not count: where init
# does not reap orphans (containers, microVMs), a finished wrapper lingers as a zombie and
# `kill -0` alone would report it alive forever. Without `ps`, fall back to `kill -0 -PGID`.
_ALIVE_FN = (
    "wb_alive() { if command -v ps >/dev/null 2>&1; then "
    "ps -A -o pgid= -o stat= | awk -v g=\"$1\" '$1 == g && $2 !~ /^Z/ {n++} END {exit !n}'; "
    "else kill -0 -\"$1\" 2>/dev/null; fi; }"
)


# -- settings checks and quoting --------------------------------------------------------------------
def _field_error(name: str, field_name: str, value, rule: str) -> LaunchError:
    return LaunchError(f"ssh host {name!r}: {field_name}={value!r} is not allowed; {rule}")


def remote_path_word(path: str) -> str:
    """A remote path as one shell word: quoted, except that a leading ``~`` / ``~/`` is ``"$HOME"``.

    ``~/wb dir/$(x)`` -> ``"$HOME"/'wb dir/$(x)'`` (the remote shell expands only ``$HOME``).
    """
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@dataclass(frozen=True)
class HostConfig:
    """One checked SSH host entry (see ``workbench.runs.settings.SSHHost`` for the fields)."""

    name: str
    hostname: str
    user: str | None
    port: int
    identity_file: str | None
    known_hosts: str | None
    workdir: str
    python: str
    setup: str
    strict_host_key_checking: bool

    @property
    def address(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.hostname}:{self.port}"


def _pattern(field_name: str, pattern: re.Pattern, rule: str, *, optional: bool = False):
    def check(name: str, value):
        if optional and value is None:
            return None
        if not isinstance(value, str) or not pattern.match(value):
            raise _field_error(name, field_name, value, rule)
        return value
    return check


def _line(field_name: str, *, path: bool = False, optional: bool = False):
    """A non-empty single line; for remote paths, '~' only as a leading '~/' (what we expand)."""
    def check(name: str, value):
        if optional and value is None:
            return None
        if not isinstance(value, str) or not value or any(c in value for c in "\n\r\0"):
            raise _field_error(name, field_name, value, "a non-empty single line")
        if path and value.startswith("~") and not (value == "~" or value.startswith("~/")):
            raise _field_error(name, field_name, value, "'~' is only expanded as a leading '~/' (no '~user')")
        return value
    return check


def _port(name: str, value):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise _field_error(name, "port", value, "an integer 1-65535")
    return value


def _setup(name: str, value):
    if not isinstance(value, str) or "\0" in value:
        raise _field_error(name, "setup", value, "shell text without NUL bytes")
    return value


# field -> check(host name, value) returning the value to use. hostname and user become ssh
# arguments: strict patterns. Remote paths are quoted, so any single line is fine. known_hosts goes
# into `-o UserKnownHostsFile=`, which ssh splits on whitespace. setup is run as-is (admin-written).
_FIELD_CHECKS: dict[str, Callable[[str, object], object]] = {
    "hostname": _pattern("hostname", _HOSTNAME, "a DNS name or IP address: letters, digits, '.', '-', '_', "
                         "starting with a letter or digit"),
    "user": _pattern("user", _USER, "a POSIX user name ([A-Za-z_][A-Za-z0-9._-]*, at most 32 characters)", optional=True),
    "port": _port,
    "identity_file": _line("identity_file", optional=True),
    "known_hosts": _pattern("known_hosts", re.compile(r"^[^\s\0]+$"),
                            "a path without whitespace (ssh splits UserKnownHostsFile on spaces)", optional=True),
    "workdir": _line("workdir", path=True),
    "python": _line("python", path=True),
    "setup": _setup,
    "strict_host_key_checking": lambda name, value: bool(value),
}


def host_config(target: str, settings) -> HostConfig:
    """The checked host entry of ``ssh://NAME``; LaunchError naming the field for anything unsafe."""
    name = target.split("://", 1)[1] if "://" in target else ""
    hosts = dict(getattr(settings, "ssh_hosts", None) or {})
    if not _HOST_NAME.match(name):
        raise LaunchError(f"target={target!r} is not allowed; use ssh://NAME with NAME one of the ssh hosts in "
                          f"settings: {', '.join(sorted(hosts)) or '(none configured)'}")
    if name not in hosts:
        raise LaunchError(f"unknown ssh host {name!r} in target={target!r}; hosts in settings: "
                          f"{', '.join(sorted(hosts)) or '(none configured; add one under ssh_hosts in settings.yaml)'}")
    host = hosts[name]
    values = host.model_dump() if hasattr(host, "model_dump") else dict(host)
    checked = {f: check(name, values.get(f)) for f, check in _FIELD_CHECKS.items()}
    return HostConfig(name=name, **checked)


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
        f"printf '%s\\n' {shlex.quote(run_sh)} > run.sh",
        "sh_=$(command -v bash || command -v sh)",  # bash when present: setup lines often use `source`
        'setsid nohup "$sh_" run.sh < /dev/null > /dev/null 2>&1 &',
        "i=0",
        "while [ ! -s pgid ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done",
        "[ -s pgid ] || { echo 'the run wrapper did not start; see stdout.log' >&2; exit 3; }",
        "pwd",
        "cat pgid",
    ])


def wrapper_script(setup: str, train_words: str) -> str:
    """run.sh: the run's process-group leader. ``setup`` is the admin's line, run as-is."""
    lines = ["echo $$ > pgid", f"exec > {STDOUT_FILE} 2>&1 < /dev/null", "export PYTHONUNBUFFERED=1"]
    if setup.strip():
        lines += ["# host setup line (from the workbench settings, run as-is):", setup,
                  f"rc=$?; if [ $rc -ne 0 ]; then echo \"workbench: the host's setup line failed (exit $rc)\"; "
                  f"echo {SETUP_FAILED_CODE} > {EXIT_CODE_FILE}; exit {SETUP_FAILED_CODE}; fi",
                  'cd -- "$WB_RUN_DIR"']  # the setup line may have changed directory
    lines += [train_words, f"echo $? > {EXIT_CODE_FILE}"]
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
    connect_timeout = 10  # seconds for ssh to reach the host
    command_timeout = 60  # seconds for a short remote command (start, alive, read)
    follow = True  # keep a `tail -F` stream open per active run between reads

    def __init__(self, target: str, settings) -> None:
        super().__init__(target, settings)
        self.host = host_config(target, settings)  # unknown / hostile host entry -> LaunchError now

    # ssh plumbing
    def _ssh(self, script: str, *, stdin: bytes | None = None, timeout: float | None = None) -> bytes:
        """Run ``script`` on the host; its stdout. LaunchError (explained) if ssh itself fails."""
        argv = ssh_argv(self.host, script, connect_timeout=self.connect_timeout)
        try:
            proc = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                                  timeout=timeout or self.command_timeout)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"ssh host {self.host.name!r} ({self.host.address}): no answer within "
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
        """The remote trainer command as shell text (python's leading ``~/`` expanded remotely)."""
        launch = run.get("launch") or {}
        argv = train_command("@RECIPE@", "@RUNDIR@", python="@PYTHON@", stdout_events=True,
                             num_processes=int(launch.get("num_processes", 1)), cpu=bool(launch.get("cpu", False)),
                             mixed_precision=str(launch.get("mixed_precision", "no")))
        # placeholders are shlex-safe words, replaced by expanding words after quoting the rest
        return (shell_join(argv).replace("@PYTHON@", remote_path_word(self.host.python))
                .replace("@RECIPE@", '"$WB_RUN_DIR"/recipe.yaml').replace("@RUNDIR@", '"$WB_RUN_DIR"'))

    def start(self, run: dict) -> dict:
        run_id = str(run["id"])
        if not _HOST_NAME.match(run_id) or ".." in run_id:
            raise LaunchError(f"run id={run_id!r} is not allowed as a remote directory name")
        root = self.host.workdir.rstrip("/") or "/"
        runs_root = remote_path_word(f"{root}/runs")
        run_dir = remote_path_word(f"{root}/runs/{run_id}")
        script = start_script(run_dir, runs_root, wrapper_script(self.host.setup, self.train_words(run)))
        recipe = run.get("recipe")
        if recipe is None:
            recipe = (Path(run["run_dir"]) / "recipe.yaml").read_text()
        out = self._ssh(script, stdin=recipe.encode()).decode().strip().splitlines()
        try:
            remote_dir, pgid = out[-2], int(out[-1])
        except (IndexError, ValueError):
            raise LaunchError(f"ssh host {self.host.name!r}: unexpected answer when starting the run: {out!r}") from None
        return {"host": self.host.name, "remote_dir": remote_dir, "pgid": pgid, "pid": pgid,
                "events_file": f"{remote_dir}/{EVENTS_FILE}"}

    def alive(self, run: dict) -> bool | None:
        """Whether the remote run's process group has a running process; None if the host is unreachable."""
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
        self._mirror(run, offset, data[: chunk.offset - offset])
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
        if code == 0:
            return None, None  # a clean exit wrote its own final status event
        if code == SETUP_FAILED_CODE:
            return "failed", f"the setup line of ssh host {self.host.name!r} failed; see {remote_dir}/{STDOUT_FILE}"
        if code > 128 and code - 128 in signal.Signals._value2member_map_:
            return "failed", f"remote trainer killed by {signal.Signals(code - 128).name} (exit code {code})"
        return "failed", f"remote trainer exited with code {code}; see {remote_dir}/{STDOUT_FILE} on {self.host.name}"

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

    @staticmethod
    def _mirror(run: dict, offset: int, data: bytes) -> None:
        """Keep a local copy of the remote events.jsonl in the local run dir (byte-identical)."""
        run_dir = run.get("run_dir")
        if not data or not run_dir or not Path(run_dir).is_dir():
            return
        fd = os.open(Path(run_dir) / EVENTS_FILE, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
