"""Workbench settings (SSH hosts, SLURM defaults, a Ray cluster, concurrency slots, who gets which
role), one YAML file under the home.

Nothing secret lives here: SSH authentication uses the user's own keys and known_hosts files,
referenced by path. ``setup`` lines of SSH hosts are shell set-up run as-is on that host (e.g.
``source ~/venv/bin/activate``): they are written by whoever administers the settings file, never
taken from a launch form.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from workbench.home import workbench_home
from workbench.runs.authz import ROLES
from workbench.yamlsafe import YamlInputError, read_yaml_file

SETTINGS_FILE = "settings.yaml"
_HOST_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_USER_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$")
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DOMAIN_PATTERN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$")
DEFAULT_ROLES = ("viewer", "member")  # a default of admin would make every account of the provider an admin


class SettingsError(ValueError):
    """Invalid settings (the message names the field, the value and what is allowed)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class SSHHost(_Strict):
    """A remote GPU host reached with the system ``ssh`` client."""

    hostname: str
    """DNS name or IP address (letters, digits, '.', '-', '_')."""
    user: str | None = None
    """Remote user (default: ssh's own default)."""
    port: int = Field(22, ge=1, le=65535)
    identity_file: str | None = None
    """Private key path on this machine (default: ssh-agent / ~/.ssh)."""
    known_hosts: str | None = None
    """known_hosts file to trust (default: ~/.ssh/known_hosts)."""
    workdir: str = "~/.workbench"
    """Remote workbench home; runs go to WORKDIR/runs/RUN_ID."""
    python: str = "python3"
    """Python on the remote host that has the workbench installed."""
    setup: str = ""
    """Shell line run before training on the host (activate an environment); admin-written."""
    strict_host_key_checking: bool = True
    """Refuse hosts whose key is not already in known_hosts (never auto-accept unless turned off)."""

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, value: str) -> str:
        if not _HOST_PATTERN.match(value):
            raise ValueError(f"hostname={value!r} is not allowed; use letters, digits, '.', '-', '_'")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not _USER_PATTERN.match(value):
            raise ValueError(f"user={value!r} is not allowed; use a POSIX user name ([A-Za-z_][A-Za-z0-9._-]*)")
        return value

    @field_validator("workdir", "python")
    @classmethod
    def _no_newlines(cls, value: str, info) -> str:
        if not value or any(c in value for c in "\n\r\0"):
            raise ValueError(f"{info.field_name}={value!r} is not allowed; a non-empty single-line path")
        return value


class SlurmDefaults(_Strict):
    """Defaults for sbatch scripts and the slurm launcher."""

    partition: str = ""
    """Partition (empty: leave a placeholder / the cluster default)."""
    account: str = ""
    """Account to charge (empty: placeholder / default)."""
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(1, ge=0)
    time: str = "01:00:00"
    """Wall-clock limit, HH:MM:SS or D-HH:MM:SS."""

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        if not re.match(r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$", value):
            raise ValueError(f"time={value!r} is not allowed; use HH:MM:SS or D-HH:MM:SS")
        return value

    @field_validator("partition", "account")
    @classmethod
    def _slurm_name(cls, value: str, info) -> str:
        if value and not _NAME_PATTERN.match(value):
            raise ValueError(f"{info.field_name}={value!r} is not allowed; use letters, digits, '.', '-', '_'")
        return value


# The Ray Jobs API address: ``HOST:PORT``, ``http(s)://HOST[:PORT]`` or ``ray://HOST[:PORT]`` (the
# dashboard's HTTP port; see workbench/runs/launchers/ray_jobs.py for why ``ray://`` names it here).
RAY_DASHBOARD_PORT = 8265
_RAY_ADDRESS = re.compile(r"^(?:(?P<scheme>https?|ray)://)?(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,252})(?::(?P<port>\d{1,5}))?/?$")
_RAY_ADDRESS_HELP = ("HOST:PORT, http://HOST:PORT, https://HOST:PORT or ray://HOST:PORT, with PORT the Ray dashboard's "
                     f"(Jobs API) port, {RAY_DASHBOARD_PORT} by default (not Ray Client's 10001)")


def ray_jobs_url(address: str, *, field: str = "ray.address") -> str:
    """The Jobs API URL of a Ray address: ``ray://h:p`` and ``h:p`` -> ``http://h:p``, ``https://h``
    -> ``https://h:8265``. ValueError naming ``field``, the value and what is allowed."""
    match = _RAY_ADDRESS.match(address.strip()) if isinstance(address, str) else None
    port = int(match["port"]) if match and match["port"] else RAY_DASHBOARD_PORT
    if match is None or not 1 <= port <= 65535:
        raise ValueError(f"{field}={address!r:.200} is not allowed; use {_RAY_ADDRESS_HELP}")
    scheme = "https" if match["scheme"] == "https" else "http"
    return f"{scheme}://{match['host']}:{port}"


class RayCluster(_Strict):
    """The Ray cluster of target ``ray`` (``ray://HOST:PORT`` names one directly) and how each run is
    submitted to it as one job of Ray's Jobs API."""

    address: str = ""
    """Ray Jobs API (dashboard) address for target 'ray': HOST:PORT, http(s)://HOST:PORT or ray://HOST:PORT; PORT is the dashboard's, 8265 by default (empty: target 'ray' is not offered)."""
    python: str = "python"
    """Python on the cluster's nodes that has the workbench installed (a name on the job's PATH or an absolute path)."""
    workdir: str = ""
    """Directory on the cluster where runs live (WORKDIR/runs/RUN_ID, checkpoints included: a resume reads them there), on storage every node that may run a job sees. Empty: the run's own directory under this workbench home, for a cluster that shares this machine's filesystem (or is this machine)."""
    num_cpus: float = Field(1.0, ge=0, le=4096, allow_inf_nan=False)
    """CPUs Ray reserves for each run (entrypoint_num_cpus): a run waits PENDING until a node has them free."""
    num_gpus: float = Field(0.0, ge=0, le=1024, allow_inf_nan=False)
    """GPUs Ray reserves for each run (entrypoint_num_gpus; 0: the run trains on the CPU)."""
    runtime_env: dict = Field(default_factory=dict)
    """Ray runtime environment of every job (pip, conda, working_dir, py_modules, env_vars ...), admin-written; the workbench adds its own env_vars."""
    token_file: str = ""
    """For a cluster with Ray's token authentication (RAY_AUTH_MODE=token): the path, on this machine, of a file holding the cluster's token (chmod 600, as ssh wants a key), sent as 'Authorization: Bearer' with every Jobs API request. The settings hold the path, never the token. Empty: Ray's own sources in the app's environment (RAY_AUTH_MODE=token with RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), or none."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value.strip():
            ray_jobs_url(value)
        return value.strip()

    @field_validator("token_file")
    @classmethod
    def _token_file(cls, value: str) -> str:
        text = value.strip()
        if text and (any(c in text for c in "\n\r\0") or not (text.startswith("/") or text.startswith("~"))):
            raise ValueError(f"token_file={value!r} is not allowed; an absolute path (or ~/...) on this machine, one line")
        return text

    @field_validator("python", "workdir")
    @classmethod
    def _one_line(cls, value: str, info) -> str:
        if any(c in value for c in "\n\r\0") or (info.field_name == "python" and not value.strip()):
            raise ValueError(f"{info.field_name}={value!r} is not allowed; a non-empty single-line path or command name"
                             if info.field_name == "python" else
                             f"{info.field_name}={value!r} is not allowed; a single-line path (empty: this workbench home)")
        return value

    @field_validator("runtime_env")
    @classmethod
    def _env_vars(cls, value: dict) -> dict:
        env_vars = value.get("env_vars", {})
        if not isinstance(env_vars, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
            raise ValueError(f"runtime_env.env_vars={env_vars!r:.200} is not allowed; a mapping of names to strings "
                             "(quote numbers: \"1\")")
        return value


def _one_line_entries(values: list[str], what: str) -> list[str]:
    """Entries stripped; ValueError naming the first that is empty, multi-line or over 254 characters."""
    cleaned = []
    for value in values:
        text = str(value).strip()
        if not text or len(text) > 254 or any(c.isspace() for c in text):
            raise ValueError(f"entry {str(value)!r:.80} is not allowed; {what}")
        cleaned.append(text)
    return cleaned


class RoleMapping(_Strict):
    """Which role a user who signed in through the identity provider (OpenID Connect) gets, from the
    provider's claims (``workbench.runs.roles.role_for``), and which role the CLI gets on a server
    database (``cli_roles``). The first rule that matches wins, highest role first: ``admins``, then
    ``admin_groups``, ``member_groups``, ``member_domains``, else ``default_role``."""

    admins: list[str] = Field(default_factory=list)
    """Admins by their verified email (any case) or their subject ('sub', the provider's stable user id, exact)."""
    admin_groups: list[str] = Field(default_factory=list)
    """Groups (exact names as the provider sends them in the groups claim) whose users are admins."""
    member_groups: list[str] = Field(default_factory=list)
    """Groups whose users are members (launch; cancel, resume, delete their own runs)."""
    member_domains: list[str] = Field(default_factory=list)
    """Email domains (e.g. lab.org: exactly that domain, not its subdomains) whose verified addresses are members."""
    default_role: str = "viewer"
    """The role of a signed-in user no rule above matches: viewer (reads only) or member."""
    groups_claim: str = "groups"
    """The claim that lists a user's groups (Keycloak, Okta, Entra ID: 'groups'; some providers use 'roles')."""
    trust_unverified_email: bool = False
    """Use an email the provider does not mark email_verified=true (Entra ID sends no such claim). Off: such a user is named by their subject and matched by subject and groups only, since an unverified address is whatever the account holder typed."""
    cli_roles: dict[str, str] = Field(default_factory=dict)
    """OS user name -> role of the CLI on a server database (WORKBENCH_DB=postgresql://...); unlisted users are members. On the local SQLite file the CLI is always admin (its user can write the file directly)."""

    @field_validator("admins")
    @classmethod
    def _admins(cls, value: list[str]) -> list[str]:
        return _one_line_entries(value, "an email address or a subject (no spaces, at most 254 characters)")

    @field_validator("admin_groups", "member_groups")
    @classmethod
    def _groups(cls, value: list[str]) -> list[str]:
        return _one_line_entries(value, "a group name (no spaces, at most 254 characters)")

    @field_validator("member_domains")
    @classmethod
    def _domains(cls, value: list[str]) -> list[str]:
        domains = []
        for entry in value:
            domain = str(entry).strip().lower()
            if not _DOMAIN_PATTERN.match(domain):
                raise ValueError(f"entry {str(entry)!r:.80} is not allowed; a domain such as lab.org "
                                 "(no '@', no scheme)")
            domains.append(domain)
        return domains

    @field_validator("default_role")
    @classmethod
    def _default_role(cls, value: str) -> str:
        if value not in DEFAULT_ROLES:
            raise ValueError(f"not allowed; one of: {', '.join(DEFAULT_ROLES)} "
                             "(name admins in admins or admin_groups)")
        return value

    @field_validator("groups_claim")
    @classmethod
    def _claim(cls, value: str) -> str:
        if not _NAME_PATTERN.match(value):
            raise ValueError("not allowed; a claim name (letters, digits, '.', '-', '_')")
        return value

    @field_validator("cli_roles")
    @classmethod
    def _cli_roles(cls, value: dict[str, str]) -> dict[str, str]:
        for user, role in value.items():
            if not _USER_PATTERN.match(str(user)):
                raise ValueError(f"user {str(user)!r:.80} is not allowed; a POSIX user name "
                                 "([A-Za-z_][A-Za-z0-9._-]*)")
            if role not in ROLES:
                raise ValueError(f"{user}={role!r} is not allowed; a role, one of: {', '.join(ROLES)}")
        return value


class Settings(_Strict):
    """Everything the workbench remembers between sessions."""

    ssh_hosts: dict[str, SSHHost] = Field(default_factory=dict)
    """Named SSH hosts; launch with target 'ssh://NAME'."""
    slurm: SlurmDefaults = Field(default_factory=SlurmDefaults)
    ray: RayCluster = Field(default_factory=RayCluster)
    """The Ray cluster of target 'ray' (or name one with 'ray://HOST:PORT')."""
    cpu_slots: int = Field(3, ge=1)
    """Concurrent local CPU runs (1 thread each); more wait in the queue. 3 fits the quick comparison."""
    reward_funcs_allowed: list[str] = Field(default_factory=list)
    """Import references ('package.module:function') the app may offer as reward functions besides the built-ins. The app imports nothing else: importing a module runs its code, and who types in the app does not own the server. The CLI is not limited by this list."""
    gpu_slots: int | None = Field(None, ge=0)
    """Local GPUs runs may take: the first N visible devices (None: all of them; 0: none, local runs use the CPU slots). Each run takes one free device per process and waits until that many are free; a run needing more than there are fails at once."""

    roles: RoleMapping = Field(default_factory=RoleMapping)
    """Who gets which role when signing in through the identity provider, and the CLI's role on a server database."""

    trusted_proxies: list[str] = Field(default_factory=list)
    """Reverse proxies (IP addresses or CIDR networks, e.g. 127.0.0.1 for one on this machine) whose X-Forwarded-For the sign-in limit believes: with one listed, a client behind it is counted under the right-most address in that header that is not itself a listed proxy. Empty (the default): forwarding headers are ignored, since a client can write them, and attempts are counted under the connection's address ('local' for this machine, SSH tunnels included). The proxy must append to X-Forwarded-For or overwrite it."""

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: list[str]) -> list[str]:
        proxy_networks(value)  # raises naming the first entry that is not an address or network
        return [entry.strip() for entry in value]

    @field_validator("reward_funcs_allowed")
    @classmethod
    def _references(cls, value: list[str]) -> list[str]:
        from workbench.engine.rewards import is_import_reference

        for ref in value:
            if not is_import_reference(ref):
                raise ValueError(f"reward_funcs_allowed: {ref!r:.80} is not an import reference 'package.module:function'")
        return value

    @field_validator("ssh_hosts")
    @classmethod
    def _host_names(cls, value: dict) -> dict:
        for name in value:
            if not _NAME_PATTERN.match(name):
                raise ValueError(f"ssh host name {name!r} is not allowed; use letters, digits, '.', '-', '_'")
        return value

    def trusted_proxy_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return proxy_networks(self.trusted_proxies)


def proxy_networks(entries: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``trusted_proxies`` entries (an IP address or a CIDR network each; host bits are allowed,
    '10.1.2.3/8' is 10.0.0.0/8) as networks; raises ValueError naming the first that is neither."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(str(entry).strip(), strict=False))
        except ValueError:
            raise ValueError(f"trusted_proxies: {str(entry)!r:.80} is not an IP address or network "
                             "(e.g. 127.0.0.1, 10.0.0.0/8, ::1)") from None
    return networks


def settings_path(home: Path | None = None) -> Path:
    return (home or workbench_home()) / SETTINGS_FILE


def load_settings(home: Path | None = None) -> Settings:
    """Settings from the home's settings.yaml (defaults when there is none)."""
    path = settings_path(home)
    if not path.exists():
        return Settings()
    try:
        return Settings.model_validate(read_yaml_file(path) or {})
    except YamlInputError as err:
        raise SettingsError(f"{path}: {err}") from None
    except ValidationError as err:
        from workbench.recipe import format_validation_error

        message = format_validation_error(err, Settings).replace("invalid recipe:", "invalid settings:", 1)
        raise SettingsError(f"{path}: {message}") from None


def save_settings(settings: Settings, home: Path | None = None) -> Path:
    """Write atomically (a crash mid-write keeps the old file)."""
    path = settings_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False))
    os.replace(tmp, path)
    return path
