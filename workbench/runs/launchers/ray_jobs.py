"""Runs on a Ray cluster, each run one job of Ray's Jobs API (``ray.job_submission.JobSubmissionClient``),
as verl and OpenRLHF users submit their trainers.

Targets: ``ray://HOST:PORT`` names the cluster's Jobs API (its dashboard, ``http://HOST:PORT``;
PORT defaults to 8265); plain ``ray`` takes the address from the settings' ``ray.address``. Ray's
own ``ray://`` URLs name the *Ray Client* server (port 10001), which the Jobs API does not need:
reaching it would make the app a Ray driver (a full ``ray`` import and a gRPC session per call).
The workbench speaks only HTTP to the dashboard, so here ``ray://HOST:PORT`` is that HTTP address.

A run on the cluster (``Settings.ray``; the client is imported only when a Ray target is used):

- start: ``submit_job`` with ``submission_id`` ``wb-RUN_ID-N`` (attempt N: a deterministic id, so
  a submission that timed out can be found with ``ray job status``), the settings' runtime_env
  with the workbench's env_vars added (the recipe as ``WORKBENCH_RECIPE_YAML``), and
  ``entrypoint_num_cpus`` / ``entrypoint_num_gpus``: Ray keeps a job PENDING until a node has
  them free, so runs beyond the cluster's slots wait in Ray's own queue (a job still PENDING after
  the head's ``RAY_JOB_START_TIMEOUT_SECONDS``, 900 s by default, is failed by Ray: a team that
  queues longer sets it higher on the head). The entrypoint (``entrypoint_script``) makes the run
  directory on the cluster, writes recipe.yaml there from the env var (a directory that already
  has one, prepared by the service on a shared filesystem, keeps it) and execs the one train
  command (``accelerate launch -m workbench train --stdout-events``).
- the run directory: ``ray.workdir/runs/RUN_ID`` on the cluster (checkpoints, events.jsonl, the
  final model), or with an empty ``workdir`` the run's own directory under this workbench home
  (a cluster that shares this machine's filesystem, or is this machine).
- events: the trainer mirrors every event line to stdout (``@@wb {...}``), which is the job's log.
  A follower thread per job streams the log (``tail_job_logs``, a websocket) and keeps the event
  lines as the bytes of events.jsonl; reads take them from the store's offset, so a reconnect
  (the follower replays the log from its start) never loses or repeats a step. A job that has
  ended is read once whole (``get_job_logs``). The lines are copied into the local run
  directory's events.jsonl when the cluster's run directory is elsewhere.
- alive: the job is PENDING or RUNNING. cancel: ``stop_job`` (Ray sends SIGTERM to the
  entrypoint's process tree, the trainer records ``cancelled``, and Ray sends SIGKILL after the
  head's ``RAY_JOB_STOP_WAIT_TIME_S``, 3 s by default); the job ends STOPPED.
- exit_status: a FAILED job is ``failed`` with its exit code and the last traceback line of its
  log (or Ray's message: a job that never started); STOPPED is ``cancelled``.
- resume: a new job ``wb-RUN_ID-N+1`` running ``train --resume DIR`` in the same cluster
  directory; its handle keeps the ids of the jobs before it (``previous_job_ids``) and the
  event offset it started at (``events_base``: the new job's log holds only its own lines).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from workbench.engine.events import STDOUT_PREFIX
from workbench.export.commands import ShellVar, shell_join, train_command
from workbench.home import workbench_home
from workbench.recipe import format_validation_error
from workbench.runs.launchers.base import (LAUNCHERS, ConfigError, EventChunk, LaunchError, Launcher, mirror_events,
                                           parse_events, status_from_exit_code, text_cause)
from workbench.runs.launchers.local import RUN_ID_ENV
from workbench.runs.launchers.ssh import remote_path_word
from workbench.runs.settings import _NAME_PATTERN as NAME_PATTERN
from workbench.runs.settings import RAY_DASHBOARD_PORT, RayCluster, ray_jobs_url
from workbench.runs.store import TERMINAL_STATUSES

INSTALL_HINT = "the ray target needs Ray's Jobs client in the workbench's environment: pip install 'ray[default]'"
RECIPE_ENV = "WORKBENCH_RECIPE_YAML"  # the recipe's YAML text, written to recipe.yaml by the entrypoint
ACTIVE_STATES = frozenset({"PENDING", "RUNNING"})  # ray.job_submission.JobStatus values of a job that is not over
REQUEST_TIMEOUT_S = 30.0  # the Jobs client has no timeout of its own: a head that does not answer would hang the caller
STOP_WAIT_S = 3.0  # Ray's default RAY_JOB_STOP_WAIT_TIME_S: SIGTERM -> SIGKILL on the cluster
ENDED_FOLLOWER_WAIT_S = 5.0  # a job that ended: how long its follower gets to pass on the last lines
KEEP_ENDED_STREAMS = 64  # streams of ended jobs kept in memory (each only its unread bytes)
_EVENT_PREFIX = STDOUT_PREFIX


class _NoAnswer(LaunchError):
    """The Ray head did not answer in time (a submission may still have been accepted)."""


class _UnknownJob(LaunchError):
    """The cluster has no record of the job (never submitted, or the head was restarted since)."""


TOKEN_HINT = ("set ray.token_file in Settings to a file holding the cluster's token (Ray token authentication), or "
              "RAY_AUTH_MODE=token with RAY_AUTH_TOKEN_PATH in the app's environment")


def token_headers(cluster: RayCluster) -> dict[str, str]:
    """``{"Authorization": "Bearer TOKEN"}`` from ``ray.token_file`` (read at each launcher's start, so
    a rotated token is picked up), or {} without one (Ray's client then uses its own sources).
    ConfigError naming ray.token_file when the file cannot be read, is readable by group or others
    (as ssh refuses such a key) or holds no token."""
    if not cluster.token_file:
        return {}
    where = f"ray.token_file={cluster.token_file!r}"
    path = Path(cluster.token_file).expanduser()
    try:
        if path.stat().st_mode & 0o077:
            raise ConfigError(f"{where} is readable by group or others; chmod 600 it (it holds the cluster's token)")
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where} cannot be read ({getattr(err, 'strerror', None) or type(err).__name__}); "
                          "give the path of a file holding the cluster's token") from None
    if not token or not token.isprintable() or any(c.isspace() for c in token):
        raise ConfigError(f"{where} holds no token (one line of printable characters without spaces)")
    return {"Authorization": f"Bearer {token}"}


def ray_address(target: str, cluster: RayCluster) -> str:
    """The Jobs API URL of a target: ``ray://HOST[:PORT]`` -> ``http://HOST:PORT``; ``ray`` -> the
    settings' ``ray.address``. ConfigError naming the field, the value and what is allowed."""
    if target == "ray":
        if not cluster.address:
            raise ConfigError("target='ray' needs ray.address in settings (the Ray dashboard's HOST:PORT, e.g. "
                              "127.0.0.1:8265), or name the cluster in the target: ray://HOST:PORT")
        try:
            return ray_jobs_url(cluster.address)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    if not target.startswith("ray://"):
        raise ConfigError(f"target={target!r} is not allowed; use ray://HOST:PORT (the Ray dashboard's Jobs API "
                          "address) or ray (ray.address in settings)")
    try:
        return ray_jobs_url(target, field="target")
    except ValueError:
        raise ConfigError(f"target={target!r:.200} is not allowed; use ray://HOST:PORT with PORT the Ray dashboard's "
                          f"(Jobs API) port, {RAY_DASHBOARD_PORT} by default (not Ray Client's 10001), or ray "
                          "(ray.address in settings)") from None


def ray_cluster(settings) -> RayCluster:
    """The settings' ray section, validated again (settings built with ``model_construct`` or plain
    dicts skip their own checks, and these values reach a shell on the cluster)."""
    section = getattr(settings, "ray", None)
    values = section.model_dump() if isinstance(section, RayCluster) else dict(section or {})
    try:
        return RayCluster.model_validate(values)
    except ValidationError as err:
        problems = format_validation_error(err, RayCluster).split("\n", 1)[1].strip()
        raise ConfigError(f"settings ray: {problems}") from None


# -- the job's entrypoint (shell text; every variable part quoted) -----------------------------------
def entrypoint_script(run_dir: str, python: str, train_words: str, *, new_run: bool, free_port: bool) -> str:
    """The job's entrypoint (Ray runs it with ``sh -c``): into the run directory (made for a new
    run; a resume needs it to exist), recipe.yaml from ``$WORKBENCH_RECIPE_YAML`` when the
    directory has none, then exec the trainer. ``train_words`` may use ``$WB_RUN_DIR``,
    ``$WB_PYTHON`` and (``free_port``: several processes) ``$WB_PORT``, a free port on the node."""
    directory = remote_path_word(run_dir)
    lines = ["set -e"]
    if new_run:
        lines += [f"mkdir -p -- {directory}", f"cd -- {directory}", "WB_RUN_DIR=$(pwd)",
                  f'[ -e recipe.yaml ] || printf \'%s\' "${RECIPE_ENV}" > recipe.yaml']
    else:
        lines += [f"cd -- {directory}", "WB_RUN_DIR=$(pwd)"]
    lines.append(f"WB_PYTHON={remote_path_word(python)}")
    if free_port:  # accelerate's rendezvous: two runs on one node must not share 29500
        probe = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
        lines.append(f'WB_PORT=$("$WB_PYTHON" -c "{probe}")')
    lines.append(f"exec {train_words}")
    return "\n".join(lines)


def ray_log_preamble(job_id: str, entrypoint: str) -> str:
    """The line Ray's job supervisor writes into a job's log before starting its entrypoint."""
    return f"Running entrypoint for job {job_id}: {entrypoint}\n"


def log_cause_text(log: str, preamble: str = "") -> str:
    """Why a job's entrypoint died, from its log: the last traceback's final line, else the last
    line that is not an event (``sh: 1: exec: /opt/py: not found``); at most 500 characters.

    ``preamble`` (``ray_log_preamble``) is removed wherever it stands: Ray writes it through a
    buffered file that it flushes only after starting the entrypoint, so the error of an entrypoint
    that dies at once (a missing Python) can precede it, and its last line (our ``exec ...``) would
    read as the cause."""
    if preamble:
        log = log.replace(preamble, "", 1)
    tail = log[-65536:]
    cause = text_cause(tail)
    if cause:
        return cause
    lines = [line.strip() for line in tail.splitlines() if line.strip() and not line.startswith(_EVENT_PREFIX)]
    return lines[-1][-500:] if lines else ""


# -- the event lines of a job's log ------------------------------------------------------------------
class _EventStream:
    """The event lines of one job's log as the bytes of its events.jsonl: ``feed`` the log's text
    in any chunks (a line may be cut between chunks); ``take(pos)`` returns the bytes from
    position ``pos`` of this job's stream on (``base``: the first byte still held)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.base = 0
        self.partial = ""
        self.done = False  # the whole log has been fed
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def feed(self, text: str) -> None:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()  # "" after a newline; else a line still being written
        events = "".join(line[len(_EVENT_PREFIX):] + "\n" for line in lines if line.startswith(_EVENT_PREFIX))
        with self.lock:
            self.data += events.encode()

    def take(self, pos: int) -> bytes | None:
        """Bytes from ``pos`` (dropping those before it); None if ``pos`` is outside what is held."""
        with self.lock:
            if not self.base <= pos <= self.base + len(self.data):
                return None
            del self.data[: pos - self.base]
            self.base = pos
            return bytes(self.data)

    def end(self) -> int:
        with self.lock:
            return self.base + len(self.data)


class _Follower:
    """A thread streaming one job's log over the Jobs API websocket into an :class:`_EventStream`
    (from the log's start; the stream ends ``done`` once Ray has sent the log of an ended job)."""

    def __init__(self, client, job_id: str) -> None:
        self.stream = _EventStream()
        self.job_id = job_id
        self._client = client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"ray-follow:{job_id}")
        self.thread.start()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._task = loop.create_task(self._pump())
            loop.run_until_complete(self._task)
        except BaseException as err:  # noqa: BLE001  (cancelled, or the link dropped: a new follower replays)
            self.stream.error = err
        finally:
            loop.close()

    async def _pump(self) -> None:
        async for text in self._client.tail_job_logs(self.job_id):
            self.stream.feed(text)
        self.stream.done = True

    @property
    def usable(self) -> bool:
        return self.stream.done or (self.thread.is_alive() and self.stream.error is None)

    def stop(self) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed meanwhile
                pass
        self.thread.join(timeout=5)


_followers: OrderedDict[tuple[str, str], _Follower | _EventStream] = OrderedDict()  # (url, job id) -> its log
_ended: set[tuple[str, str]] = set()  # jobs seen in a final state (their log is complete)
_state_lock = threading.Lock()


def stop_followers() -> None:
    """End every follower of this process (tests; they are daemon threads otherwise)."""
    with _state_lock:
        followers = [f for f in _followers.values() if isinstance(f, _Follower)]
        _followers.clear()
    for follower in followers:
        follower.stop()


def _keep(key: tuple[str, str], stream: _Follower | _EventStream) -> None:
    """Remember a job's follower or complete stream; forget the oldest complete ones beyond the cap."""
    with _state_lock:
        _followers[key] = stream
        _followers.move_to_end(key)
        complete = [k for k, v in _followers.items() if isinstance(v, _EventStream) or v.stream.done]
        for old in complete[:-KEEP_ENDED_STREAMS]:
            _followers.pop(old, None)


# -- the Jobs client ---------------------------------------------------------------------------------
_clients: dict[tuple[str, str], Any] = {}  # (url, Authorization header) -> client
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="ray-jobs")


def _new_client(url: str, headers: dict[str, str]):
    from ray.job_submission import JobSubmissionClient  # ~0.6 s: only where a Ray target is used

    # the client logs every closed log stream at INFO on stderr (`runs ... --wait` would print them)
    logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)
    return JobSubmissionClient(url, headers=headers or None)


@LAUNCHERS.register("ray")
class RayLauncher(Launcher):
    """One Ray job per run attempt, through the cluster's Jobs API."""

    scheme = "ray"
    target_help = "ray://HOST:PORT (a Ray cluster's Jobs API) or ray (ray.address in settings)"
    alive_every_s = 2.0  # one HTTP request to the head per check
    request_timeout = REQUEST_TIMEOUT_S

    @classmethod
    def offered_targets(cls, settings) -> dict[str, str]:
        address = getattr(getattr(settings, "ray", None), "address", "")
        return {"ray": f"Ray cluster ({address})"} if address else {}

    def __init__(self, target: str, settings) -> None:
        super().__init__(target, settings)
        self.cluster = ray_cluster(settings)
        self.url = ray_address(target, self.cluster)
        if importlib.util.find_spec("ray") is None:  # no import: that is ~0.6 s, paid at the first request
            raise ConfigError(INSTALL_HINT)
        self.headers = token_headers(self.cluster)

    # -- requests ----------------------------------------------------------------------------------
    def _url(self, run: dict) -> str:
        """Where the run's job was submitted (its handle), else this target's cluster."""
        return str((run.get("handle") or {}).get("address") or self.url)

    def _call(self, url: str, what: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """``fn(client, ...)`` against the cluster at ``url`` within ``request_timeout``; LaunchError
        saying what failed (``_UnknownJob`` for a job the cluster does not know)."""

        def request():
            from ray.exceptions import AuthenticationError  # loaded with the client: no extra cost

            key = (url, self.headers.get("Authorization", ""))  # a rotated token gets a client of its own
            try:
                client = _clients.get(key)
                if client is None:
                    client = _clients[key] = _new_client(url, self.headers)
                return fn(client, *args, **kwargs)
            except AuthenticationError as err:  # a cluster with token authentication: missing / wrong token
                reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise LaunchError(f"Ray cluster at {url} refused the request while {what} ({reason}); {TOKEN_HINT}") from None

        future = _pool.submit(request)
        try:
            return future.result(timeout=self.request_timeout)
        except concurrent.futures.TimeoutError:
            raise _NoAnswer(f"Ray cluster at {url}: no answer within {self.request_timeout:g} s while {what}") from None
        except ImportError:
            raise LaunchError(INSTALL_HINT) from None
        except (ConnectionError, OSError) as err:  # requests' errors are OSErrors too
            raise LaunchError(f"Ray cluster at {url} is unreachable while {what} ({type(err).__name__}); check that "
                              "its head runs and that the address names its dashboard (Jobs API) port, 8265 by "
                              "default, not Ray Client's 10001") from None
        except LaunchError:  # said already (a refused token)
            raise
        except RuntimeError as err:  # the Jobs client's "Request failed with status code N: ..."
            if "status code 404" in str(err):
                raise _UnknownJob(f"Ray cluster at {url} has no such job ({what}): {err}") from None
            raise LaunchError(f"Ray cluster at {url}: {what} failed: {str(err).strip()[:800]}") from None

    def _info(self, run: dict):
        job_id = (run.get("handle") or {}).get("job_id")
        if not job_id:
            raise _UnknownJob(f"run {run.get('id')!r} has no Ray job id; was it started?")
        return self._call(self._url(run), f"asking for job {job_id}", lambda c: c.get_job_info(job_id))

    # -- what a run's job is ---------------------------------------------------------------------------
    def cluster_run_dir(self, run: dict) -> str:
        """The run's directory on the cluster: the attempt before's (a resume), else
        ``ray.workdir/runs/RUN_ID``, else (no workdir) the run's own directory here."""
        run_id = str(run["id"])
        if not NAME_PATTERN.match(run_id) or ".." in run_id:
            raise LaunchError(f"run id={run_id!r} is not allowed as a directory name on the cluster")
        launch = run.get("launch") or {}
        previous = (launch.get("previous_handle") or {}).get("run_dir") if launch.get("resume") else None
        if previous:
            return str(previous)
        return f"{self.cluster.workdir.rstrip('/')}/runs/{run_id}" if self.cluster.workdir else str(run["run_dir"])

    def train_words(self, run: dict) -> str:
        """The trainer's command line over the entrypoint's $WB_PYTHON, $WB_RUN_DIR (and $WB_PORT)."""
        launch = run.get("launch") or {}
        processes = int(launch.get("num_processes", 1))
        gpus = self.cluster.num_gpus
        if gpus and processes > gpus:
            raise LaunchError(f"run {run['id']}: num_processes={processes} needs one GPU per process, but each Ray "
                              f"job reserves ray.num_gpus={gpus:g}; raise ray.num_gpus in the settings or launch "
                              "fewer processes")
        argv = train_command("recipe.yaml", ShellVar("WB_RUN_DIR"), python=ShellVar("WB_PYTHON"), stdout_events=True,
                             num_processes=processes, cpu=not gpus,
                             mixed_precision=str(launch.get("mixed_precision", "no")), main_process_port=ShellVar("WB_PORT") if processes > 1 else None,
                             resume=bool(launch.get("resume")))
        return shell_join(argv)

    def runtime_env(self, run: dict, recipe_yaml: str | None) -> dict:
        """The settings' runtime_env with the workbench's env_vars added (theirs win over the
        settings': they are how the job finds its run). With no ``ray.workdir`` the cluster shares
        this machine's filesystem, so it also gets this workbench home (models, datasets) unless
        the settings name another."""
        env = dict(self.cluster.runtime_env)
        env_vars = dict(env.get("env_vars") or {})
        if not self.cluster.workdir:
            env_vars.setdefault("WORKBENCH_HOME", str(workbench_home()))
        env_vars.update({"PYTHONUNBUFFERED": "1", RUN_ID_ENV: str(run["id"])})
        if recipe_yaml is not None:
            env_vars[RECIPE_ENV] = recipe_yaml
        env["env_vars"] = env_vars
        return env

    # -- Launcher interface ------------------------------------------------------------------------
    def start(self, run: dict) -> dict:
        run_id = str(run["id"])
        launch = run.get("launch") or {}
        resuming = bool(launch.get("resume"))
        previous = (launch.get("previous_handle") or {}) if resuming else {}
        previous_ids = [*previous.get("previous_job_ids", []), *([previous["job_id"]] if previous.get("job_id") else [])]
        run_dir = self.cluster_run_dir(run)
        processes = int(launch.get("num_processes", 1))
        entrypoint = entrypoint_script(run_dir, self.cluster.python, self.train_words(run), new_run=not resuming,
                                       free_port=processes > 1)
        recipe = None
        if not resuming:
            recipe = run.get("recipe")
            if recipe is None:
                recipe = (Path(run["run_dir"]) / "recipe.yaml").read_text()
        options = {"entrypoint": entrypoint, "runtime_env": self.runtime_env(run, recipe),
                   "metadata": {"workbench_run": run_id},
                   "entrypoint_num_cpus": self.cluster.num_cpus, "entrypoint_num_gpus": self.cluster.num_gpus or None}
        attempt = len(previous_ids) + 1
        for _ in range(3):  # an id taken by a submission whose answer was lost: the next attempt's
            job_id = f"wb-{run_id}-{attempt}"
            try:
                self._call(self.url, f"submitting run {run_id}",
                           lambda c: c.submit_job(submission_id=job_id, **options))
                break
            except _NoAnswer as err:
                raise LaunchError(f"{err}; the job may have been submitted anyway: check with `ray job status "
                                  f"--address {self.url} {job_id}` and stop it with `ray job stop --address "
                                  f"{self.url} {job_id}`") from None
            except LaunchError as err:
                if "already exists" not in str(err):
                    raise
                attempt += 1
        else:
            raise LaunchError(f"run {run_id}: Ray job ids wb-{run_id}-{len(previous_ids) + 1} to {job_id} are all taken")
        handle = {"job_id": job_id, "address": self.url, "run_dir": run_dir,
                  "events_base": int(run.get("events_offset") or 0)}
        return {**handle, "previous_job_ids": previous_ids} if previous_ids else handle

    def state(self, run: dict) -> str | None:
        """The job's Ray status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED); '' when the cluster
        has no record of it; None when it cannot be told now."""
        try:
            info = self._info(run)
        except _UnknownJob:
            return ""
        except LaunchError:
            return None
        state = str(getattr(info.status, "value", info.status))
        if state not in ACTIVE_STATES:
            with _state_lock:
                _ended.add((self._url(run), run["handle"]["job_id"]))
        return state

    def alive(self, run: dict) -> bool | None:
        state = self.state(run)
        return None if state is None else state in ACTIVE_STATES

    def cancel(self, run: dict, grace_s: float = 10.0) -> None:
        """``stop_job``: Ray sends SIGTERM to the entrypoint's processes (the trainer records
        ``cancelled``), then SIGKILL after the head's RAY_JOB_STOP_WAIT_TIME_S; waits up to
        ``grace_s`` (at least Ray's default wait and a little more) for the job to end."""
        state = self.state(run)
        job_id = (run.get("handle") or {}).get("job_id")
        if state is None:
            raise LaunchError(f"cannot stop Ray job {job_id} of run {run['id']}: the Ray cluster at {self._url(run)} "
                              "does not answer now; try again")
        if state not in ACTIVE_STATES:
            return
        self._call(self._url(run), f"stopping job {job_id}", lambda c: c.stop_job(job_id))
        deadline = time.monotonic() + max(grace_s, STOP_WAIT_S + 2.0)
        while time.monotonic() < deadline and self.alive(run) is not False:
            time.sleep(0.2)

    def read_events(self, run: dict) -> EventChunk:
        """New complete event lines of the job's log since ``run['events_offset']``."""
        handle = run.get("handle") or {}
        offset = int(run.get("events_offset") or 0)
        pos = offset - int(handle.get("events_base") or 0)
        if pos < 0:
            raise LaunchError(f"run {run['id']}: the store's event offset {offset} is before the start of Ray job "
                              f"{handle.get('job_id')} ({handle.get('events_base')})")
        data = self._stream(run, pos).take(pos)
        if data is None:  # the log is still being replayed up to where the store is
            return EventChunk([], offset)
        chunk = parse_events(data, offset)
        if handle.get("run_dir") != run.get("run_dir"):  # the cluster's directory is elsewhere: keep a copy here
            mirror_events(run, offset, data[: chunk.offset - offset])
        return chunk

    def _stream(self, run: dict, pos: int) -> _EventStream:
        """The job's event stream: its follower's (started here if there is none or it broke), or,
        for a job that has ended, the whole log read once (a follower that is still passing on
        its last lines gets ``ENDED_FOLLOWER_WAIT_S``)."""
        url, job_id = self._url(run), str(run["handle"]["job_id"])
        key = (url, job_id)
        with _state_lock:
            current = _followers.get(key)
            ended = key in _ended or run.get("status") in TERMINAL_STATUSES
        if isinstance(current, _EventStream):
            if current.base <= pos:
                return current
            current = None  # the store is behind what was kept (another reader): read the log again
        if isinstance(current, _Follower) and ended and not current.stream.done:
            current.thread.join(timeout=ENDED_FOLLOWER_WAIT_S)
        if isinstance(current, _Follower) and current.usable and current.stream.base <= pos \
                and (current.stream.done or not ended):  # an ended job's reader must get every line
            return current.stream
        if current is not None:
            current.stop()
        if ended:
            stream = _EventStream()
            stream.feed(self._call(url, f"reading the log of job {job_id}", lambda c: c.get_job_logs(job_id)))
            stream.done = True
            _keep(key, stream)
            return stream
        follower = _Follower(self._client(url), job_id)
        _keep(key, follower)
        return follower.stream

    def _client(self, url: str):
        return self._call(url, "connecting", lambda c: c)

    def exit_status(self, run: dict) -> tuple[str | None, str | None]:
        """After the job ended without a final event: FAILED -> ``failed`` with the exit code and
        the last traceback line of its log (or Ray's message), STOPPED -> ``cancelled``."""
        try:
            info = self._info(run)
        except LaunchError:
            return None, None  # the cluster forgot the job (a restarted head): nothing to go on
        job_id = run["handle"]["job_id"]
        state = str(getattr(info.status, "value", info.status))
        if state == "STOPPED":
            return "cancelled", f"Ray job {job_id} was stopped"
        if state != "FAILED":
            return None, None
        code = info.driver_exit_code
        try:
            log = self._call(self._url(run), f"reading the log of job {job_id}", lambda c: c.get_job_logs(job_id))
            cause = log_cause_text(log, ray_log_preamble(job_id, info.entrypoint or ""))
        except LaunchError:
            cause = ""
        where = f"Ray job {job_id} on {self._url(run)}"
        if code is not None and code > 128:
            return status_from_exit_code(code, None, where)
        message = (info.message or "").strip().splitlines()
        why = cause or (message[0] if message else "no message")
        return "failed", f"{where} failed" + (f" (exit code {code})" if code is not None else "") + f": {why}"

    def latest_checkpoint(self, run: dict):
        """The newest checkpoint where this machine can see it (no ``ray.workdir``: the run's own
        directory); None for a cluster-only directory (the resumed trainer finds it there itself)."""
        if (run.get("handle") or {}).get("run_dir", run.get("run_dir")) != run.get("run_dir"):
            return None
        return super().latest_checkpoint(run)
