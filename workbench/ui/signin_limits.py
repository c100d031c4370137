"""Sign-in attempt limits: growing, bounded delays per client address and server-wide.

Why: the shared password is the only secret of a team's workbench, and a per-browser-session
sleep let four browsers try 40 passwords in 38 s. Every failed sign-in is now counted, in one
ledger shared by every session of every app process on this home, under two keys: the client's
address (``address:...``) and the whole server (``global``). Changing browsers, sessions or the
typed name does not reset the address. The name is *not* a key: names are free labels over one
shared password, so a name key protected nothing, while its lock (which refuses even the right
password) let anyone keep the owner's name locked from anywhere.

Policies (``KEY_POLICIES``, one ``BackoffPolicy`` per key kind): the first ``free_failures``
failures of a key cost nothing; the n-th failure locks the key for
``first_delay_s * 2**(n - free_failures)`` seconds, at most ``max_delay_s``; failures are forgotten
``window_s`` after the key's last one.

- address: 5 free, then 2 s, 4 s, 8 s ... at most 15 min, remembered 1 h. One address gets about
  17 guesses in its first hour, then 4 an hour.
- global: 50 free, then 2 s, 4 s ... at most 60 s, remembered 10 min. One address never reaches it
  (its 17 failures of the first hour are under 50, and from the 10th on its own delays exceed the
  10 min window, so the global count starts again), so a single attacker cannot lock anyone else
  out. Many addresses together (a botnet, rotating real addresses) are slowed to about one guess a
  minute for all of them, 60 an hour, instead of 4 an hour per address; while they keep it up,
  everyone's sign-in waits at most 60 s per attempt. 50 free failures in 10 min is far above what a
  team mistyping produces.

While any key of an attempt is locked, the attempt is refused *without looking at the password*
(a right password too), and the refusal does not count. So nobody is locked out for good: a lock
lasts at most ``max_delay_s``, then a right password works. A successful sign-in refunds its
charge and clears its address key; it only refunds the global key (a right password from one user
must not reset the count of a distributed guesser).

Atomicity: ``admit`` charges the attempt as a failure in the same SQLite transaction that checks
the locks (``BEGIN IMMEDIATE``), and ``succeeded`` refunds it. Parallel attempts therefore queue
on the lock instead of all slipping in at the moment a delay ends. ``admit`` also deletes rows
whose last failure is older than the longest window, so rotating addresses cannot grow the file
without bound.

Store: a SQLite file (``signin_attempts.sqlite`` under the workbench home), which every thread and
process sharing the home can read and lock; it holds addresses, never names or passwords.
The clock is injected (wall-clock seconds, shared across processes), so tests move time.

Client address (``client_address``): forwarding headers are the client's to write, so they are
read only when ``trusted_proxies`` (settings) names the peer; see that function.
"""

from __future__ import annotations

import ipaddress
import math
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

LEDGER_FILE = "signin_attempts.sqlite"
SCHEMA = ("""CREATE TABLE IF NOT EXISTS signin_failures (
    key TEXT PRIMARY KEY, failures INTEGER NOT NULL, last_failure REAL NOT NULL, locked_until REAL NOT NULL)""",
          "CREATE INDEX IF NOT EXISTS signin_failures_last ON signin_failures (last_failure)")


@dataclass(frozen=True)
class BackoffPolicy:
    """How many failures are free, how the delay grows after them, its cap, how long failures
    are remembered (seconds), and whether a right password forgets the key's failures."""

    free_failures: int = 5
    first_delay_s: float = 2.0
    max_delay_s: float = 15 * 60.0
    window_s: float = 60 * 60.0
    forget_on_success: bool = True

    def __post_init__(self):
        # pruning deletes rows older than the window: a lock must end before its row may go
        if self.window_s < self.max_delay_s:
            raise ValueError(f"window_s={self.window_s} is below max_delay_s={self.max_delay_s}")

    def delay_s(self, failures: int) -> float:
        """The lock after the ``failures``-th failure of a key: 0 while free, then doubling, capped."""
        if failures < self.free_failures:
            return 0.0
        exponent = failures - self.free_failures
        return self.max_delay_s if exponent >= 64 else min(self.max_delay_s, self.first_delay_s * 2.0**exponent)


GLOBAL_KEY = "global"
# key kind (the part before ':') -> its policy; the numbers are justified in the module docstring
KEY_POLICIES: dict[str, BackoffPolicy] = {
    "address": BackoffPolicy(),
    GLOBAL_KEY: BackoffPolicy(free_failures=50, first_delay_s=2.0, max_delay_s=60.0, window_s=10 * 60.0,
                              forget_on_success=False),
}


def key_kind(key: str) -> str:
    return key.split(":", 1)[0]


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


def after_refund(state: KeyState, policy: BackoffPolicy) -> KeyState:
    """The key's state with one charged failure taken back (its lock recomputed from the count left)."""
    failures = max(0, state.failures - 1)
    return KeyState(failures, state.last_failure, state.last_failure + policy.delay_s(failures) if failures else 0.0)


@dataclass(frozen=True)
class Admission:
    """``allowed``: the attempt may check its password (and was charged as a failure);
    ``wait_s``: otherwise, how long until it may; ``locked``: the keys that refused it;
    ``failures``: the charged count per key."""

    allowed: bool
    wait_s: float
    failures: dict[str, int]
    locked: tuple[str, ...] = ()


class AttemptLedger:
    """Failed sign-ins per key in a SQLite file, with an injected clock (see the module docstring)."""

    def __init__(self, path: str | Path, policies: Mapping[str, BackoffPolicy] | None = None,
                 clock: Callable[[], float] = time.time):
        self.path, self.policies, self.clock = Path(path), dict(policies or KEY_POLICIES), clock

    def policy(self, key: str) -> BackoffPolicy:
        return self.policies[key_kind(key)]

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        for statement in SCHEMA:
            conn.execute(statement)
        return conn

    @staticmethod
    def _states(conn: sqlite3.Connection, keys: list[str]) -> dict[str, KeyState]:
        rows = conn.execute(f"SELECT key, failures, last_failure, locked_until FROM signin_failures "
                            f"WHERE key IN ({','.join('?' * len(keys))})", keys).fetchall()
        found = {key: KeyState(failures, last, until) for key, failures, last, until in rows}
        return {key: found.get(key, KeyState()) for key in keys}

    @staticmethod
    def _write(conn: sqlite3.Connection, states: dict[str, KeyState]) -> None:
        conn.executemany("INSERT OR REPLACE INTO signin_failures VALUES (?, ?, ?, ?)",
                         [(k, s.failures, s.last_failure, s.locked_until) for k, s in states.items()])

    def _transaction(self, work: Callable[[sqlite3.Connection], object]):
        """``work(conn)`` under the write lock, taken first: no other attempt reads in between."""
        with closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

    def state(self, key: str) -> KeyState:
        with closing(self._connect()) as conn:
            return self._states(conn, [key])[key]

    def row_count(self) -> int:
        with closing(self._connect()) as conn:
            return conn.execute("SELECT COUNT(*) FROM signin_failures").fetchone()[0]

    def wait_s(self, keys: Iterable[str]) -> float:
        """Seconds until an attempt under all of ``keys`` is admitted (the longest lock)."""
        keys, now = sorted(set(keys)), self.clock()
        with closing(self._connect()) as conn:
            return max((wait_s(s, now) for s in self._states(conn, keys).values()), default=0.0)

    def admit(self, keys: Iterable[str]) -> Admission:
        """Refuse while any key is locked; else charge one failure to every key, atomically.
        Rows older than the longest window go first."""
        keys, now = sorted(set(keys)), self.clock()
        horizon = now - max(p.window_s for p in self.policies.values())

        def work(conn: sqlite3.Connection) -> Admission:
            conn.execute("DELETE FROM signin_failures WHERE last_failure < ?", (horizon,))
            states = self._states(conn, keys)
            waits = {k: wait_s(s, now) for k, s in states.items()}
            if any(waits.values()):
                return Admission(False, max(waits.values()), {k: s.failures for k, s in states.items()},
                                 tuple(k for k, w in waits.items() if w > 0))
            charged = {k: after_failure(s, now, self.policy(k)) for k, s in states.items()}
            self._write(conn, charged)
            return Admission(True, 0.0, {k: s.failures for k, s in charged.items()})

        return self._transaction(work)

    def succeeded(self, keys: Iterable[str]) -> None:
        """A right password: refund the charge; keys whose policy says so forget their failures."""
        keys = sorted(set(keys))

        def work(conn: sqlite3.Connection) -> None:
            forget = [k for k in keys if self.policy(k).forget_on_success]
            conn.executemany("DELETE FROM signin_failures WHERE key = ?", [(k,) for k in forget])
            kept = [k for k in keys if k not in forget]
            if kept:
                self._write(conn, {k: after_refund(s, self.policy(k)) for k, s in self._states(conn, kept).items()})

        self._transaction(work)


def ledger_keys(address: str) -> list[str]:
    """The keys one attempt is counted under: its client address and the whole server."""
    return [f"address:{address}", GLOBAL_KEY]


def describe_wait(seconds: float) -> str:
    """'7 s', '4 min 16 s', '15 min': whole seconds, rounded up (never '0 s' while locked)."""
    total = max(1, math.ceil(seconds))
    minutes, secs = divmod(total, 60)
    if not minutes:
        return f"{secs} s"
    return f"{minutes} min" + (f" {secs} s" if secs else "")


# ---- the client address -----------------------------------------------------------------------

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def parse_ip(value: object) -> Address | None:
    """An IP address from a peer or a forwarded entry ('1.2.3.4', '1.2.3.4:80', '[::1]:80'), IPv4
    inside IPv6 unwrapped; None for anything else (a header is the client's to fill with junk)."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    text = value.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def address_key(address: Address) -> str:
    """The ledger's name for an address: IPv6 by its /64 (one subscriber's block, which it can
    rotate through freely), IPv4 as is; loopback is 'local'."""
    if address.is_loopback:
        return "local"
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _trusted(address: Address, networks: Sequence[Network]) -> bool:
    return any(address.version == n.version and address in n for n in networks)


def uvicorn_choice(hops: Sequence[Address | None]) -> Address | None:
    """What uvicorn's proxy-headers middleware (default ``FORWARDED_ALLOW_IPS``: 127.0.0.1, ::1)
    makes the peer of a loopback connection with these ``X-Forwarded-For`` entries: the right-most
    one that is not 127.0.0.1 / ::1 (None: not an IP), else the first."""
    return next((hop for hop in reversed(hops) if hop not in LOOPBACK), hops[0])


def client_address(peer: object, forwarded_for: Iterable[object] | None = (),
                   trusted_proxies: Sequence[Network] = ()) -> str:
    """The address an attempt is counted under.

    ``peer`` is Streamlit's ``st.context.ip_address``, which is not simply the TCP peer: it is
    None for a loopback peer (a local browser, an SSH tunnel, a reverse proxy on this machine),
    and uvicorn, which serves Streamlit, by default (``FORWARDED_ALLOW_IPS`` unset) replaces a
    loopback peer with the right-most ``X-Forwarded-For`` entry, whatever the client wrote there
    ('9.9.9.9', '....'). So a peer that is missing, not an IP, loopback, or the entry uvicorn
    would have taken from this request's ``X-Forwarded-For`` (``uvicorn_choice``) is taken as
    *loopback*; any other peer is the TCP peer. (A direct client can thus choose between its own
    address and 'local', never more. Leave ``FORWARDED_ALLOW_IPS`` unset: list proxies here.)

    Forwarding headers are read only when the peer is a trusted proxy (``trusted_proxies``;
    loopback counts only when a listed network holds 127.0.0.1 or ::1): then the key is the
    right-most ``X-Forwarded-For`` entry that is not itself a trusted proxy (earlier entries are the
    client's to forge; a proxy must append to the header or overwrite it). An entry that is not an
    IP address stops the walk at the last trusted hop. ``X-Real-IP`` is never read: a proxy that
    sets only it passes a client-written ``X-Forwarded-For`` through untouched, which uvicorn
    would honour too. Untrusted or unreadable: the peer, or 'local' for loopback."""
    entries = [part for value in (forwarded_for or ()) if isinstance(value, str)
               for part in value.split(",") if part.strip()]
    hops = [parse_ip(part) for part in entries]
    address = parse_ip(peer)
    if address is None or (hops and address == uvicorn_choice(hops)):
        address = LOOPBACK[0]
    loopback_trusted = any(_trusted(a, trusted_proxies) for a in LOOPBACK)
    if not (loopback_trusted if address.is_loopback else _trusted(address, trusted_proxies)):
        return address_key(address)
    for hop in reversed(hops):
        if hop is None:
            break
        address = hop
        if not (loopback_trusted if hop.is_loopback else _trusted(hop, trusted_proxies)):
            break
    return address_key(address)
