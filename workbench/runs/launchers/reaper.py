"""The wrapper of a local run: ``python reaper.py STDOUT EXIT_CODE -- ARGV...`` (stdlib only).

It starts ARGV (``accelerate launch ... -m workbench train``) with its output in STDOUT and
lives until *every* process of the run has ended, then writes the launcher's exit code to
EXIT_CODE (shell convention: 128 + N when killed by signal N). So the wrapper's pid alone tells
whether anything of the run still runs:

- it is the run's child subreaper (``PR_SET_CHILD_SUBREAPER``): when ``accelerate launch`` dies
  (``kill -9``, OOM killer) its workers are re-parented to the wrapper instead of init, and the
  wrapper keeps reaping them; the trainer goes on writing events, the collector goes on ingesting,
  and the final status comes from the trainer's own last event;
- it ignores the cancel's SIGTERM (sent to the whole process group) and waits for the rest.

Run as a script by path, not ``-m``: importing the ``workbench`` package would load pandas and
more into a process that only waits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
COMMAND_NOT_FOUND = 127  # shell convention


def become_subreaper() -> bool:
    """Orphaned descendants become our children (Linux >= 3.4); False where not available."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def shell_exit_code(wait_status: int) -> int:
    """A ``wait`` status as a shell reports it: the exit code, or 128 + N after signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def reap_all(launcher_pid: int) -> int | None:
    """Reap children (the launcher and every orphan handed to us) until none is left; returns the
    launcher's shell exit code (None if it was never seen, which cannot happen for our own child)."""
    code = None
    while True:
        try:
            pid, status = os.wait()  # retried on EINTR (PEP 475): the SIGTERM handler returns
        except ChildProcessError:
            return code
        if pid == launcher_pid:
            code = shell_exit_code(status)


def write_atomically(path: str, text: str) -> None:
    """A reader sees no file or the whole text, never a part of it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    stdout_path, exit_code_path, separator, *command = argv
    if separator != "--" or not command:
        print("usage: reaper.py STDOUT EXIT_CODE -- COMMAND...", file=sys.stderr)
        return 2
    become_subreaper()
    # A handler, not SIG_IGN: handlers are reset to the default in the child at exec, an ignore is
    # inherited (the trainer must still get the SIGTERM and record ``cancelled``).
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    with open(stdout_path, "wb") as out:
        try:
            launcher = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        except OSError as err:
            out.write(f"could not start {command[0]!r}: {err}\n".encode())
            write_atomically(exit_code_path, f"{COMMAND_NOT_FOUND}\n")
            return COMMAND_NOT_FOUND
    code = reap_all(launcher.pid)
    launcher.returncode = code  # reaped above: Popen must not wait for it again
    write_atomically(exit_code_path, f"{code}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
