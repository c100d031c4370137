"""A real OpenSSH server on 127.0.0.1 for the SSH launcher tests.

Everything lives in a temp dir: the server's host key, a client key pair, ``authorized_keys`` and a
``known_hosts`` file holding the server's key as ``[127.0.0.1]:PORT``. The server listens on
127.0.0.1 only, accepts only that client key, and runs in the foreground (``sshd -D``) as a child
of the test process.

If ``sshd`` is missing it is installed with apt-get when running as root; otherwise the tests skip
locally and FAIL under ``CI=true`` (a missing system component is never a silent pass there).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import apt_install, missing_component

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")


def _missing(reason: str):
    missing_component(f"sshd is required: {reason}")


def ensure_sshd() -> str:
    """Path of the sshd binary (installing openssh-server with apt-get if root and it is missing)."""
    for path in SSHD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    problem = apt_install(["openssh-server", "openssh-client"],
                          lambda: any(os.access(path, os.X_OK) for path in SSHD_CANDIDATES))
    if problem:
        _missing(problem)
    return next(path for path in SSHD_CANDIDATES if os.access(path, os.X_OK))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> str:
    """A fresh ed25519 key pair without passphrase; returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "workbench-test", "-f", str(path)],
                   check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class SSHServer:
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    host_public_key: str
    process: subprocess.Popen
    log: Path

    def host_entry(self, **overrides) -> dict:
        """An ``ssh_hosts`` settings entry reaching this server."""
        entry = {"hostname": "127.0.0.1", "port": self.port, "user": self.user,
                 "identity_file": str(self.client_key), "known_hosts": str(self.known_hosts)}
        return {**entry, **overrides}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_sshd(workdir: Path) -> SSHServer:
    """Start sshd on a free 127.0.0.1 port with keys and known_hosts made in ``workdir``."""
    sshd = ensure_sshd()
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        _missing("the OpenSSH client (ssh, ssh-keygen) is not installed")
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = workdir / "host_ed25519"
    host_pub = _keygen(host_key)
    client_key = workdir / "client_ed25519"
    (workdir / "authorized_keys").write_text(_keygen(client_key) + "\n")
    os.chmod(client_key, 0o600)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    port = free_port()
    known_hosts = workdir / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {' '.join(host_pub.split()[:2])}\n")
    config = workdir / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {workdir / 'sshd.pid'}",
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        "PermitRootLogin prohibit-password", "AllowTcpForwarding no", "X11Forwarding no", "PrintMotd no",
        "LogLevel VERBOSE", "MaxStartups 50:30:100",
    ]) + "\n")
    check = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.fail(f"sshd rejected the test config: {check.stderr}")
    log = workdir / "sshd.log"
    process = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                               stderr=open(log, "wb"), stdin=subprocess.DEVNULL)
    server = SSHServer(port, getpass.getuser(), client_key, known_hosts, host_pub, process, log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"sshd exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    pytest.fail(f"sshd did not listen on 127.0.0.1:{port} within 20 s: {log.read_text()[-2000:]}")
