"""Sign-in attempt limits: growing, bounded delays per client address and per name, server-wide.

Why: the shared password is the only secret of a team's workbench, and a per-browser-session
sleep let four browsers try 40 passwords in 38 s. Every failed sign-in is now counted, in one
ledger shared by every session of every app process on this home, under two keys: the client's
address and the (lower-cased) name typed at sign-in. Changing browsers, sessions or names does
not reset the address; changing addresses does not reset the name.

Policy (``BackoffPolicy``): the first ``free_failures`` failures of a key cost nothing; the n-th
failure after them locks the key for ``first_delay_s * 2**(n - free_failures)`` seconds, at most
``max_delay_s`` (defaults: 5 free, then 2 s, 4 s, 8 s ... up to 15 min). While any key of an
attempt is locked, the attempt is refused *without looking at the password* (a right password
too), and the refusal does not count. A key's failures are forgotten ``window_s`` after its last
failure, and a successful sign-in clears the keys it used. So nobody is locked out for good: a
lock lasts at most ``max_delay_s``, then a right password works.

Atomicity: ``admit`` charges the attempt as a failure in the same SQLite transaction that checks
the locks (``BEGIN IMMEDIATE``), and ``succeeded`` refunds it. Parallel attempts therefore queue
on the lock instead of all slipping in at the moment a delay ends.

Store: a SQLite file (``signin_attempts.sqlite`` under the workbench home), which every thread and
process sharing the home can read and lock; it holds addresses and names, never passwords.
The clock is injected (wall-clock seconds, shared across processes), so tests move time.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

LEDGER_FILE = "signin_attempts.sqlite"
SCHEMA = """CREATE TABLE IF NOT EXISTS signin_failures (
    key TEXT PRIMARY KEY, failures INTEGER NOT NULL, last_failure REAL NOT NULL, locked_until REAL NOT NULL)"""


@dataclass(frozen=True)
class BackoffPolicy:
    """How many failures are free, how the delay grows after them, its cap and how long failures
    are remembered (seconds)."""

    free_failures: int = 5
    first_delay_s: float = 2.0
    max_delay_s: float = 15 * 60.0
    window_s: float = 60 * 60.0

    def delay_s(self, failures: int) -> float:
        """The lock after the ``failures``-th failure of a key: 0 while free, then doubling, capped."""
        if failures < self.free_failures:
            return 0.0
        exponent = failures - self.free_failures
        return self.max_delay_s if exponent >= 64 else min(self.max_delay_s, self.first_delay_s * 2.0**exponent)


@dataclass(frozen=True)
class KeyState:
    """What the ledger remembers of one key."""

    failures: int = 0
    last_failure: float = 0.0
    locked_until: float = 0.0


def wait_s(state: KeyState, now: float) -> float:
    """Seconds until the key may try again (0: now)."""
    return max(0.0, state.locked_until - now)


def after_failure(state: KeyState, now: float, policy: BackoffPolicy) -> KeyState:
    """The key's state after one more failure at ``now``; failures older than the window are forgotten."""
    failures = 1 if now - state.last_failure >= policy.window_s else state.failures + 1
    return KeyState(failures, now, now + policy.delay_s(failures))


@dataclass(frozen=True)
class Admission:
    """``allowed``: the attempt may check its password (and was charged as a failure);
    ``wait_s``: otherwise, how long until it may; ``failures``: the charged count per key."""

    allowed: bool
    wait_s: float
    failures: dict[str, int]


class AttemptLedger:
    """Failed sign-ins per key in a SQLite file, with an injected clock (see the module docstring)."""

    def __init__(self, path: str | Path, policy: BackoffPolicy | None = None,
                 clock: Callable[[], float] = time.time):
        self.path, self.policy, self.clock = Path(path), policy or BackoffPolicy(), clock

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute(SCHEMA)
        return conn

    @staticmethod
    def _states(conn: sqlite3.Connection, keys: list[str]) -> dict[str, KeyState]:
        rows = conn.execute(f"SELECT key, failures, last_failure, locked_until FROM signin_failures "
                            f"WHERE key IN ({','.join('?' * len(keys))})", keys).fetchall()
        found = {key: KeyState(failures, last, until) for key, failures, last, until in rows}
        return {key: found.get(key, KeyState()) for key in keys}

    def state(self, key: str) -> KeyState:
        with closing(self._connect()) as conn:
            return self._states(conn, [key])[key]

    def wait_s(self, keys: Iterable[str]) -> float:
        """Seconds until an attempt under all of ``keys`` is admitted (the longest lock)."""
        keys, now = sorted(set(keys)), self.clock()
        with closing(self._connect()) as conn:
            return max((wait_s(s, now) for s in self._states(conn, keys).values()), default=0.0)

    def admit(self, keys: Iterable[str]) -> Admission:
        """Refuse while any key is locked; else charge one failure to every key, atomically."""
        keys, now = sorted(set(keys)), self.clock()
        with closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")  # the write lock first: no other attempt reads in between
            try:
                states = self._states(conn, keys)
                wait = max((wait_s(s, now) for s in states.values()), default=0.0)
                if wait > 0:
                    admission = Admission(False, wait, {k: s.failures for k, s in states.items()})
                else:
                    charged = {k: after_failure(s, now, self.policy) for k, s in states.items()}
                    conn.executemany("INSERT OR REPLACE INTO signin_failures VALUES (?, ?, ?, ?)",
                                     [(k, s.failures, s.last_failure, s.locked_until) for k, s in charged.items()])
                    admission = Admission(True, 0.0, {k: s.failures for k, s in charged.items()})
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return admission

    def succeeded(self, keys: Iterable[str]) -> None:
        """A right password: refund the charge and forget the keys' failures."""
        keys = sorted(set(keys))
        with closing(self._connect()) as conn:
            conn.execute(f"DELETE FROM signin_failures WHERE key IN ({','.join('?' * len(keys))})", keys)


def ledger_keys(address: str, name: str) -> list[str]:
    """The keys one attempt is counted under: its client address and its name (case-folded)."""
    return [f"address:{address}", f"name:{name.strip().casefold()}"]


def describe_wait(seconds: float) -> str:
    """'7 s', '4 min 16 s', '15 min': whole seconds, rounded up (never '0 s' while locked)."""
    total = max(1, math.ceil(seconds))
    minutes, secs = divmod(total, 60)
    if not minutes:
        return f"{secs} s"
    return f"{minutes} min" + (f" {secs} s" if secs else "")


_ADDRESS_CHARS = frozenset("0123456789abcdefABCDEF.:[]")


def client_address(ip_address: str | None, headers: dict[str, str] | None) -> str:
    """The address an attempt is counted under. Streamlit's ``st.context.ip_address`` (the
    websocket peer) when it has one; it is None for loopback peers, i.e. a direct local browser or
    a reverse proxy on this machine: then the last ``X-Forwarded-For`` entry (the one the nearest
    proxy appended; earlier entries are the client's to forge) or ``X-Real-IP``, else 'local'.
    Anything that is not an IP literal is ignored."""
    peer = _ip_literal(ip_address)
    if peer or not isinstance(headers, dict):
        return peer or "local"
    lower = {str(k).lower(): v for k, v in headers.items() if isinstance(v, str)}
    forwarded = [part.strip() for part in lower.get("x-forwarded-for", "").split(",") if part.strip()]
    return _ip_literal(forwarded[-1] if forwarded else None) or _ip_literal(lower.get("x-real-ip")) or "local"


def _ip_literal(value: object) -> str | None:
    """``value`` stripped if it looks like an IPv4 / IPv6 literal (<= 45 characters of hex digits,
    '.', ':' and brackets), else None: a header is the client's to fill with anything."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value if value and len(value) <= 45 and set(value) <= _ADDRESS_CHARS else None
