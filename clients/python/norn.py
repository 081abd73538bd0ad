"""A Python client of Norn, a distributed task store, in one file.

Standard library only: vendor this file. It speaks the node API's JSON over
HTTP/1.1 (Connect's unary protocol: ``POST /norn.v1.TaskService/<Method>``
with ``Content-Type: application/json``), over TLS with a client
certificate or a bearer token, and follows docs/API.md:

- :class:`Client` spreads calls over the nodes it is given, skips a node
  for a while after it failed (1 s, doubling up to 30 s), and retries what
  is safe to retry: reads and the idempotent writes on UNAVAILABLE and
  DEADLINE_EXCEEDED; calls on a claim for as long as the claim's lease
  lasts (a partition's failover takes a few seconds); an enqueue only with
  an id (the caller's, or the one the first attempt's WriteFailure names),
  so a retry never stores a task twice; a claim only when the request
  provably never reached a node.
- :class:`Worker` claims, renews while the handler runs, completes with its
  result, fails the attempt (or aborts for good with :class:`Permanent`)
  with the exception's text, and stops cleanly on SIGINT/SIGTERM.
- Every failure is a :class:`NornError` with the API's ``code``, a
  ``kind`` saying what is wrong, ``retryable`` and the error's details.

64-bit ids are Python ints; payloads and results are bytes (str is sent
as UTF-8); times are aware datetimes in UTC; durations are float seconds.
"""

from __future__ import annotations

import base64
import collections.abc
import dataclasses
import errno
import functools
import http.client
import json
import logging
import os
import random
import select
import signal
import socket
import ssl
import threading
import time
import typing
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator, Optional, Sequence, Union

__all__ = [
    "Client", "Worker", "Job", "NornError", "WriteFailure", "TaskSpec", "RetryPolicy", "Task",
    "ClaimInfo", "TaskUpdate", "TaskError", "ClaimedTask", "TaskPage", "Counts", "Enqueued",
    "Permanent", "TaskFailure", "YieldTask", "WorkerShutdown", "LeaseExpired", "TERMINAL",
]

log = logging.getLogger("norn")

Bytes = Union[bytes, bytearray, str]
When = Union[datetime, timedelta, float, int]  # datetime; timedelta from now; float: Unix seconds

TERMINAL = frozenset({"COMPLETED", "ABORTED", "CANCELLED", "DEAD"})
"""The terminal task statuses."""

DEFAULT_TIMEOUT = 10.0
MIN_NODE_BACKOFF, MAX_NODE_BACKOFF = 1.0, 30.0
IDLE_CONN_MAX = 50.0  # nodes close keep-alive connections idle for 2 min

# --------------------------------------------------------------------------
# Errors


@dataclass
class WriteFailure:
    """The detail of an UNAVAILABLE write that missed its quorum: the ids it
    used (retry with them), the replicas that stored it, the quorum."""

    ids: list[int]
    acks: int
    w: int


class NornError(Exception):
    """Every failure of a :class:`Client` or :class:`Worker` call.

    ``code`` is the API's code in Connect's form (``"unavailable"``,
    ``"invalid_argument"``, ...; docs/API.md "Errors"); for a failure of the
    transport it is ``"unavailable"`` (no node answered), or
    ``"unauthenticated"`` (a node refused the client certificate).
    ``kind`` says what is wrong: ``unreachable``, ``untrusted_node``,
    ``certificate_rejected``, ``certificate_expired``, ``tls``,
    ``payload_too_large``, ``request_too_large``, ``superseded``
    (FAILED_PRECONDITION: the claim ended or the task is terminal),
    ``bad_config``, ``closed``, ``canceled``, or else the code.
    ``retryable`` says whether the same call may succeed later (UNAVAILABLE,
    DEADLINE_EXCEEDED, a node out of room, no node reachable); the client
    has already retried it as far as docs/API.md allows. ``details`` are the
    error's details (dicts with ``type``, ``value`` bytes and ``debug``),
    ``write_failure`` the WriteFailure among them, ``ids`` the ids a failed
    enqueue used (retry with ``id=``).
    """

    def __init__(self, message: str, *, code: str, kind: str = "", retryable: bool = False,
                 method: str = "", node: str = "", details: Optional[list[dict[str, Any]]] = None,
                 write_failure: Optional[WriteFailure] = None, ids: Optional[list[int]] = None,
                 server_message: str = "", attempts: int = 0, http_status: int = 0) -> None:
        super().__init__(message)
        self.message, self.code, self.kind, self.retryable = message, code, kind or code, retryable
        self.method, self.node, self.details, self.write_failure = method, node, details or [], write_failure
        self.ids, self.server_message, self.attempts, self.http_status = ids or [], server_message, attempts, http_status


# Connect's codes from HTTP statuses, for answers without a Connect body.
_HTTP_CODES = {400: "internal", 401: "unauthenticated", 403: "permission_denied", 404: "unimplemented",
               429: "unavailable", 502: "unavailable", 503: "unavailable", 504: "unavailable"}

# TLS alerts a node sends when it refuses the client certificate.
_REJECTED = {
    "SSLV3_ALERT_BAD_CERTIFICATE": "bad certificate: not issued by the cluster's CA, or malformed",
    "TLSV1_ALERT_UNKNOWN_CA": "not issued by a CA the node trusts (another cluster's CA?)",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "certificate unknown to the node",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "unsupported certificate (not a client certificate?)",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "the certificate is revoked",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the node requires a client certificate (give cert= and key=, or token=)",
    "TLSV1_ALERT_ACCESS_DENIED": "access denied",
    "TLSV1_ALERT_DECRYPT_ERROR": "its signature does not verify (a key that does not match it?)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the certificate has expired (nornctl cert create-client makes a new one)",
}


class _Failure(Exception):
    """One failed attempt: an answer of a node, or a transport failure."""

    def __init__(self, code: str, message: str, *, kind: str = "", never_sent: bool = False,
                 node_down: bool = False, details: Optional[list[dict[str, Any]]] = None,
                 status: int = 0, transport: bool = False) -> None:
        super().__init__(message)
        self.code, self.message, self.kind = code, message, kind or code
        self.never_sent, self.node_down, self.transport = never_sent, node_down, transport
        self.details, self.status = details or [], status
        self.write_failure = _write_failure(self.details)

    def over_budget(self) -> bool:
        """A node's refusal of a request it had no room for: it did not run.

        It carries a google.rpc.RetryInfo detail, or, from a node before
        those, a message ending "retry later".
        """
        return self.code == "resource_exhausted" and (
            any(d.get("type") == "google.rpc.RetryInfo" for d in self.details if isinstance(d, dict))
            or self.message.rstrip().endswith("retry later"))

    def retryable(self) -> bool:
        return (self.code in ("unavailable", "deadline_exceeded") and self.kind in ("unavailable", "unreachable",
                "deadline_exceeded")) or self.over_budget()


def _varint(b: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def _write_failure(details: list[dict[str, Any]]) -> Optional[WriteFailure]:
    """Decodes the norn.v1.WriteFailure detail (protobuf: 1 repeated uint64
    ids, 2 acks, 3 w), falling back on its JSON debug form."""
    for d in details:
        if d.get("type") != "norn.v1.WriteFailure":
            continue
        try:
            b, i, wf = d["value"], 0, WriteFailure([], 0, 0)
            while i < len(b):
                key, i = _varint(b, i)
                num, wt = key >> 3, key & 7
                if wt == 2:  # packed ids
                    n, i = _varint(b, i)
                    end = i + n
                    while i < end:
                        v, i = _varint(b, i)
                        wf.ids.append(v)
                    continue
                v, i = _varint(b, i)
                if num == 1:
                    wf.ids.append(v)
                elif num == 2:
                    wf.acks = v
                elif num == 3:
                    wf.w = v
            return wf
        except (IndexError, KeyError, TypeError):
            dbg = d.get("debug") or {}
            return WriteFailure([int(x) for x in dbg.get("ids", [])], int(dbg.get("acks", 0)), int(dbg.get("w", 0)))
    return None


def _answer_failure(status: int, data: bytes) -> _Failure:
    """The failure of a non-200 answer: Connect's JSON error, or else a code
    from the HTTP status."""
    try:
        body = json.loads(data)
        code, msg = str(body["code"]), str(body.get("message", ""))
        details = []
        for d in body.get("details") or []:
            v = str(d.get("value", ""))
            details.append({"type": d.get("type", ""), "value": base64.b64decode(v + "=" * (-len(v) % 4)),
                            "debug": d.get("debug")})
    except (ValueError, KeyError, TypeError):
        text = data.decode("utf-8", "replace").strip()[:300]
        if "TLS port" in text or "HTTPS server" in text:
            return _Failure("unavailable", f"the node speaks TLS only: use https:// addresses and ca= ({text})",
                            kind="tls", never_sent=True)
        return _Failure(_HTTP_CODES.get(status, "unknown"), f"HTTP {status}: {text}", status=status)
    f = _Failure(code, msg, details=details, status=status)
    f.node_down = code == "unavailable" and f.write_failure is None
    return f


def _transport_failure(exc: BaseException, sent: bool, cert: str) -> _Failure:
    """Names a failure of the connection, TLS or HTTP layer. sent: the
    request may have reached the node (the answer is what failed)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or exc.reason or str(exc)
        return _Failure("unavailable", f"its certificate did not verify against the CA the client was given "
                        f"({why}): another cluster's CA, or an address its certificate does not name "
                        f"(nornctl cert create-node --host)", kind="untrusted_node", never_sent=True)
    if isinstance(exc, ssl.SSLError) and getattr(exc, "reason", None) in _REJECTED:
        why = _REJECTED[exc.reason]
        dates = _cert_dates(cert) if cert else None
        kind = "certificate_rejected"
        if exc.reason == "SSLV3_ALERT_CERTIFICATE_EXPIRED" or (dates and dates[2] < datetime.now(timezone.utc)):
            kind, why = "certificate_expired", f"it expired{' on ' + dates[2].isoformat() if dates else ''}"
        return _Failure("unauthenticated", f"the node refused the client certificate {cert or ''}: {why} "
                        f"[TLS: {exc.reason}]", kind=kind, never_sent=True)
    if isinstance(exc, ssl.SSLError) and getattr(exc, "reason", None) in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE"):
        return _Failure("unavailable", "the node does not speak TLS (use an http:// address, without ca=)",
                        kind="tls", never_sent=True, node_down=True)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        what = "the node did not answer in time" if sent else "connection timed out"
        return _Failure("deadline_exceeded" if sent else "unavailable", what, kind="deadline_exceeded" if sent
                        else "unreachable", never_sent=not sent, node_down=not sent, transport=True)
    reasons = {errno.ECONNREFUSED: "connection refused", errno.EHOSTUNREACH: "host unreachable",
               errno.ENETUNREACH: "network unreachable", errno.ECONNRESET: "connection reset",
               errno.EPIPE: "connection closed", errno.ECONNABORTED: "connection aborted"}
    if isinstance(exc, socket.gaierror):
        why, never = f"host name did not resolve ({exc.strerror})", True
    elif isinstance(exc, OSError) and exc.errno in reasons:
        why, never = reasons[exc.errno], exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)
    elif isinstance(exc, (http.client.RemoteDisconnected, ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        why, never = "the node closed the connection", False
    elif isinstance(exc, ssl.SSLError):
        return _Failure("unavailable", f"TLS failed: {exc}", kind="tls", never_sent=not sent, node_down=True)
    else:
        why, never = f"{type(exc).__name__}: {exc}", False
    if sent and not never:
        why += " under the call"
    return _Failure("unavailable", why, kind="unreachable", never_sent=never or not sent, node_down=True,
                    transport=True)


def _await_verdict(sock: ssl.SSLSocket, wait: float) -> None:
    """Waits for the node's verdict on the client certificate. In TLS 1.3 it
    comes after the handshake: a session ticket (Go sends them once the
    certificate is verified) or an alert, which would otherwise race the
    first request and show as a connection closed under it."""
    if not sock.pending() and not select.select([sock], [], [], wait)[0]:
        return
    sock.setblocking(False)
    try:
        sock.recv(1)  # processes the ticket; raises the alert
    except ssl.SSLWantReadError:
        pass
    finally:
        sock.setblocking(True)


def _cert_dates(path: str) -> Optional[tuple[str, datetime, datetime]]:
    """A PEM certificate's common name, notBefore and notAfter, when the ssl
    module can read them (with a private helper of CPython's; else None)."""
    try:
        info = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]
        before, after = (datetime.fromtimestamp(ssl.cert_time_to_seconds(info[k]), timezone.utc)
                         for k in ("notBefore", "notAfter"))
    except Exception:
        return None
    return ",".join(f"{k}={v}" for rdn in info.get("subject", ()) for k, v in rdn if k == "commonName"), before, after


def _check_client_cert(path: str) -> None:
    """Refuses a client certificate that has expired or is not valid yet,
    naming it, before any call."""
    dates = _cert_dates(path)
    now = datetime.now(timezone.utc)
    if dates and not dates[1] <= now <= dates[2]:
        when = f"expired on {dates[2].isoformat()}" if now > dates[2] else f"is not valid before {dates[1].isoformat()}"
        raise NornError(f"norn: client certificate {path} ({dates[0]}) {when} (nornctl cert create-client makes a "
                        "new one)", code="unauthenticated", kind="certificate_expired")


# --------------------------------------------------------------------------
# Messages: dataclasses, to and from proto3 JSON by their type hints


def _b64(b: Bytes) -> str:
    return base64.b64encode(b.encode() if isinstance(b, str) else bytes(b)).decode()


def _unb64(s: Optional[str]) -> bytes:
    return base64.b64decode(s) if s else b""


def _ts_out(t: When) -> str:
    if isinstance(t, timedelta):
        t = datetime.now(timezone.utc) + t
    elif isinstance(t, (int, float)):
        t = datetime.fromtimestamp(t, timezone.utc)
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _ts_in(s: Optional[str]) -> Optional[datetime]:
    return datetime.fromisoformat(s) if s else None


def _dur_out(d: Union[float, timedelta]) -> str:
    return f"{d.total_seconds() if isinstance(d, timedelta) else float(d):.3f}s"


_DURATIONS = {"initial_backoff", "max_backoff", "unique_for"}  # float seconds <-> "1.500s"
_ENUMS = {"status": "TASK_STATUS_", "end_reason": "CLAIM_END_"}  # kept without their prefix


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> list[tuple[str, str, tuple[Any, ...], Any]]:
    """Per field: its name, JSON name, the types its hint admits, its hint."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        kinds = typing.get_args(tp) if typing.get_origin(tp) is Union else (tp,)
        head, *rest = f.name.split("_")
        out.append((f.name, head + "".join(w.title() for w in rest), kinds, tp))
    return out


def _encode(obj: Any) -> dict[str, Any]:
    """A TaskSpec or RetryPolicy as proto3 JSON: zero fields left out, ids as
    strings, bytes in base64, times RFC 3339, durations "1.500s"."""
    out: dict[str, Any] = {}
    for name, js, kinds, _ in _hints(type(obj)):
        v = getattr(obj, name)
        if v is None or (not v and name != "queue"):
            continue
        if name in _DURATIONS:
            v = _dur_out(v)
        elif datetime in kinds:
            v = _ts_out(v)
        elif bytes in kinds:
            v = _b64(v)
        elif dataclasses.is_dataclass(v):
            v = _encode(v)
        elif isinstance(v, (list, tuple)):
            v = [str(int(x)) for x in v]
        out[js] = v
    return out


def _decode(cls: Any, j: Optional[dict[str, Any]]) -> Any:
    """A dataclass from its proto3 JSON (missing fields at their zero)."""
    j, kw = j or {}, {}
    for name, js, kinds, tp in _hints(cls):
        v = j.get(js)
        if name in _DURATIONS:
            v = float(v.rstrip("s")) if v else None
        elif name in _ENUMS:
            v = (v or "").removeprefix(_ENUMS[name]).replace("UNSPECIFIED", "")
        elif datetime in kinds:
            v = _ts_in(v)
        elif bytes in kinds:
            v = _unb64(v)
        elif typing.get_origin(tp) in (list, collections.abc.Sequence):
            item = typing.get_args(tp)[0]
            v = [_decode(item, x) if dataclasses.is_dataclass(item) else item(x) for x in v or []]
        elif dataclasses.is_dataclass(kinds[0]):
            v = None if v is None and type(None) in kinds else _decode(kinds[0], v)
        else:
            v = kinds[0](v or kinds[0]())  # int, float, bool, str: 64-bit ints arrive as strings
        kw[name] = v
    return cls(**kw)


@dataclass
class RetryPolicy:
    """A task's retries (TaskSpec.retry): after its n-th failed attempt it
    waits min(initial_backoff * multiplier**(n-1), max_backoff), less up to
    ``jitter`` of it; after ``max_attempts`` it is DEAD. Seconds."""

    max_attempts: int = 0
    initial_backoff: Optional[float] = None
    max_backoff: Optional[float] = None
    multiplier: float = 0.0
    jitter: float = 0.0


@dataclass
class TaskSpec:
    """What to enqueue (task.proto's TaskSpec; docs/API.md for each field).
    Times are datetimes (or a timedelta from now, or Unix seconds);
    durations are seconds; payload is bytes (str is sent as UTF-8)."""

    queue: str
    payload: Bytes = b""
    priority: int = 0
    not_before: Optional[When] = None
    depends_on: Sequence[int] = ()
    max_claims: int = 0
    retry: Optional[RetryPolicy] = None
    deadline: Optional[When] = None
    unique_key: str = ""
    unique_for: Optional[float] = None
    fairness_key: str = ""
    fairness_weight: int = 0


@dataclass
class TaskError:
    """One error of a task: a machine-readable code, a description, args;
    ``attempt`` is the failed attempt's claim seq (0: the end's errors)."""

    code: str
    description: str = ""
    args: list[str] = field(default_factory=list)
    attempt: int = 0


@dataclass
class ClaimInfo:
    """One claim of a task. ``end_reason`` is "" while it is live, else
    COMPLETED, ABORTED, EXPIRED, YIELDED, CANCELLED or FAILED."""

    claim_id: int
    seq: int
    worker: str
    start: Optional[datetime]
    expiry: Optional[datetime]
    end_reason: str
    ended_at: Optional[datetime]


@dataclass
class TaskUpdate:
    """A progress report made under a claim."""

    claim_id: int
    seq: int
    at: Optional[datetime]
    progress: float
    message: str
    data: bytes


@dataclass
class Task:
    """The full view of a task (task.proto's Task). ``status`` is READY,
    DELAYED, CLAIMED, COMPLETED, ABORTED, CANCELLED or DEAD."""

    id: int
    spec: TaskSpec
    status: str
    progress: float
    created_at: Optional[datetime]
    updated_at: Optional[datetime]
    current_claim: Optional[ClaimInfo]
    claims: list[ClaimInfo]
    updates: list[TaskUpdate]
    errors: list[TaskError]
    result: bytes
    finished_at: Optional[datetime]
    claim_state_unknown: bool
    failed_attempts: int
    retry_at: Optional[datetime]
    life: int


@dataclass
class ClaimedTask:
    """A task a claim handed out: the task, the claim's id (for renew,
    update, complete, abort, yield), its expiry and the API address of the
    node that leads the task's partition."""

    task: Task
    claim_id: int
    expiry: Optional[datetime]
    leader: str


@dataclass
class TaskPage:
    """One page of ListTasks; an empty ``next_page_token`` ends the list."""

    tasks: list[Task]
    next_page_token: str


@dataclass
class Counts:
    """CountTasks: the total and the count per status (READY, ...)."""

    total: int
    by_status: dict[str, int]


class Enqueued(int):
    """An enqueued task's id (an int), with the answer's ``acks`` and
    ``duplicate`` (its unique key was held: the id is the holder's)."""

    acks: int
    duplicate: bool

    def __new__(cls, id: int, acks: int = 0, duplicate: bool = False) -> Enqueued:
        v = super().__new__(cls, id)
        v.acks, v.duplicate = acks, duplicate
        return v


# --------------------------------------------------------------------------
# Nodes


class _Cancel:
    """Cancels a call in flight (a long-polling claim) from another thread by
    shutting its connection down."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._conn: Optional[http.client.HTTPConnection] = None

    def attach(self, conn: Optional[http.client.HTTPConnection]) -> None:
        """Makes conn the one cancel() shuts down; raises if cancel() came
        first (after a connect: cancel() then finds its socket)."""
        with self._lock:
            self._conn = conn
            if conn is not None and self.event.is_set():
                raise _Failure("canceled", "the call was canceled", kind="canceled")

    def cancel(self) -> None:
        with self._lock:
            self.event.set()
            sock = self._conn.sock if self._conn else None
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass


class _Endpoint:
    """One node: its base URL, a pool of idle keep-alive connections, and
    its health (skipped until ``down_until`` after a failure)."""

    def __init__(self, scheme: str, host: str, port: int, ctx: Optional[ssl.SSLContext]) -> None:
        self.scheme, self.host, self.port, self.ctx = scheme, host, port, ctx
        self.netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.base = f"{scheme}://{self.netloc}"
        self.failures, self.down_until, self.failed_at, self.last_error = 0, 0.0, 0.0, ""
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()

    def get(self, connect_timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection that still looks open, or a new one (not yet
        connected): (conn, reused)."""
        now = time.monotonic()
        while True:
            with self._lock:
                conn, used = self._idle.pop() if self._idle else (None, 0.0)
            if conn is None:
                break
            sock = conn.sock
            try:  # readable while idle: the node closed it
                if sock is not None and now - used < IDLE_CONN_MAX and not select.select([sock], [], [], 0)[0]:
                    return conn, True
            except (OSError, ValueError):
                pass
            conn.close()
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=connect_timeout, context=self.ctx), False
        return http.client.HTTPConnection(self.host, self.port, timeout=connect_timeout), False

    def put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append((conn, time.monotonic()))

    def flush(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


class _Hints:
    """Per claimed task: its partition leader (API address) and when the
    lease ends (monotonic), to aim and bound the calls on the claim."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._m: dict[int, tuple[str, Optional[float]]] = {}

    def note(self, id: int, leader: str, until: Optional[float]) -> None:
        with self._lock:
            if len(self._m) >= 100_000:
                self._m.pop(next(iter(self._m)))
            self._m[id] = (leader, until)

    def renewed(self, id: int, until: float) -> None:
        with self._lock:
            if id in self._m:
                self._m[id] = (self._m[id][0], until)

    def get(self, id: int, done: bool) -> tuple[str, Optional[float]]:
        with self._lock:
            return (self._m.pop(id, ("", None)) if done else self._m.get(id, ("", None)))


def _mono_of(t: Optional[datetime]) -> Optional[float]:
    """A server time as a monotonic time of this process."""
    return None if t is None else time.monotonic() + (t - datetime.now(timezone.utc)).total_seconds()


# --------------------------------------------------------------------------
# Client

_TASKS = "/norn.v1.TaskService/"
_Decide = Callable[[_Failure], bool]


def _idempotent(f: _Failure) -> bool:
    """Retry rule of reads and idempotent writes: UNAVAILABLE,
    DEADLINE_EXCEEDED, and failures that prove the request never ran."""
    return f.retryable() or (f.never_sent and f.kind == "unreachable")


def _no_effect(f: _Failure) -> bool:
    """Retry rule of calls that are not idempotent: only failures that
    prove the request never reached a node (or was refused unread)."""
    return (f.never_sent and f.kind == "unreachable") or f.over_budget()


class Client:
    """A client of a Norn cluster: any node answers any call.

    ``addrs``: the nodes, ``"host:port"`` (https when ``ca``, ``cert`` or
    ``token`` is given, else http) or full ``https://host:port`` URLs, as a
    list or a comma-separated string. ``ca``: the cluster CA's PEM file;
    ``cert``/``key``: the client certificate (``nornctl cert
    create-client``); ``token``: a bearer token (``nornctl token create``),
    which names the caller whatever certificate is given. ``timeout``: the
    seconds a call may take, retries included (a claim: plus its wait);
    None or 0 for no limit. ``max_attempts``, ``base_backoff`` and
    ``max_backoff``: the retries (attempt k waits a random time in [d/2, d),
    d = base_backoff * 2**(k-1) capped at max_backoff). ``w``: the default
    write quorum (0: a majority). Thread-safe; share one per process.
    """

    def __init__(self, addrs: Union[str, Sequence[str]], *, ca: Optional[str] = None, cert: Optional[str] = None,
                 key: Optional[str] = None, token: Optional[str] = None, timeout: Optional[float] = DEFAULT_TIMEOUT,
                 max_attempts: int = 5, base_backoff: float = 0.05, max_backoff: float = 2.0, w: int = 0,
                 worker_name: Optional[str] = None) -> None:
        if isinstance(addrs, str):
            addrs = [a for a in (s.strip() for s in addrs.split(",")) if a]
        if not addrs:
            raise NornError("norn: no node address given", code="invalid_argument", kind="bad_config")
        if max_attempts < 1 or base_backoff < 0 or max_backoff < base_backoff:
            raise NornError("norn: need max_attempts >= 1 and 0 <= base_backoff <= max_backoff",
                            code="invalid_argument", kind="bad_config")
        if (cert is None) != (key is None):
            raise NornError("norn: give both cert= and key= (or neither)", code="invalid_argument", kind="bad_config")
        self.timeout, self.max_attempts, self.w = timeout, max_attempts, w
        self.base_backoff, self.max_backoff = base_backoff, max_backoff
        self.worker_name = worker_name or f"{socket.gethostname()}/{os.getpid()}"
        self._token, self._cert = token, cert or ""
        default = "https" if (ca or cert or token) else "http"
        parsed = []
        for a in addrs:
            u = urllib.parse.urlsplit(a if "://" in a else f"{default}://{a}")
            try:
                port = u.port
            except ValueError:
                port = None
            if u.scheme not in ("http", "https") or not u.hostname or not port or u.path not in ("", "/"):
                raise NornError(f"norn: address {a!r}: want host:port or https://host:port",
                                code="invalid_argument", kind="bad_config")
            parsed.append((u.scheme, u.hostname, port))
        if len({s for s, _, _ in parsed}) > 1:
            raise NornError(f"norn: addresses {list(addrs)} mix http and https", code="invalid_argument",
                            kind="bad_config")
        ctx = self._tls(ca, cert, key) if parsed[0][0] == "https" else None
        if ctx is None and (ca or cert):
            raise NornError("norn: ca=/cert= given with http:// addresses", code="invalid_argument", kind="bad_config")
        self._eps: list[_Endpoint] = []
        for s, h, p in parsed:
            if all(e.base != f"{s}://{h}:{p}" for e in self._eps):
                self._eps.append(_Endpoint(s, h, p, ctx))
        self._lock = threading.Lock()
        self._next = 0
        self._hints = _Hints()
        self._closed = False

    @staticmethod
    def _tls(ca: Optional[str], cert: Optional[str], key: Optional[str]) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as e:
            raise NornError(f"norn: CA bundle {ca}: {e}", code="invalid_argument", kind="bad_config") from e
        ctx.set_alpn_protocols(["http/1.1"])
        if cert and key:
            _check_client_cert(cert)
            try:
                ctx.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as e:
                why = "the key does not match the certificate" if "KEY_VALUES_MISMATCH" in str(e) else str(e)
                raise NornError(f"norn: client certificate {cert} with key {key}: {why}", code="invalid_argument",
                                kind="bad_config") from e
        return ctx

    @property
    def addrs(self) -> list[str]:
        """The nodes' base URLs."""
        return [e.base for e in self._eps]

    def close(self) -> None:
        """Closes idle connections; later calls fail (kind ``closed``)."""
        self._closed = True
        for e in self._eps:
            e.flush()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- node choice and health (client/endpoints.go) --

    def _pick(self, avoid: Optional[_Endpoint], leader: str = "") -> _Endpoint:
        """The next healthy node in turn other than avoid (the leader's when
        it is healthy); avoid if it is the only healthy one; else the one
        that failed longest ago."""
        now = time.monotonic()
        with self._lock:
            if leader:
                for e in self._eps:
                    if e.netloc == leader and now >= e.down_until:
                        return e
            n, fallback, avoid_ok = len(self._eps), None, False
            for i in range(n):
                e = self._eps[(self._next + i) % n]
                if now < e.down_until:
                    if fallback is None or e.failed_at < fallback.failed_at:
                        fallback = e
                elif e is avoid:
                    avoid_ok = True
                else:
                    self._next = (self._next + i + 1) % n
                    return e
            return avoid if avoid_ok and avoid else fallback or self._eps[0]

    def _observe(self, e: _Endpoint, f: Optional[_Failure]) -> None:
        now = time.monotonic()
        with self._lock:
            if f is None:
                e.failures, e.down_until = 0, 0.0
                return
            e.last_error = f.message
            if not f.node_down:
                return
            e.failed_at = now
            if now >= e.down_until:  # failures of concurrent calls count once
                e.failures += 1
                e.down_until = now + min(MIN_NODE_BACKOFF * 2 ** (e.failures - 1), MAX_NODE_BACKOFF)
        e.flush()

    def _backoff(self, attempt: int) -> float:
        d = min(self.base_backoff * 2 ** (attempt - 1), self.max_backoff)
        return d / 2 + random.random() * d / 2

    # -- one attempt --

    def _attempt(self, e: _Endpoint, path: str, body: bytes, deadline: Optional[float],
                 cancel: Optional[_Cancel]) -> dict[str, Any]:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise _Failure("deadline_exceeded", "the call's time ran out", transport=True)
        conn, reused = e.get(min(5.0, remaining or 5.0))
        try:
            if not reused:
                try:
                    conn.connect()
                    if self._cert and isinstance(conn.sock, ssl.SSLSocket):
                        _await_verdict(conn.sock, min(1.0, remaining or 1.0))
                except (OSError, http.client.HTTPException) as exc:
                    raise _transport_failure(exc, False, self._cert) from exc
            if cancel:
                cancel.attach(conn)
            assert conn.sock is not None
            conn.sock.settimeout(remaining)
            headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1",
                       "User-Agent": "norn-python/1"}
            if remaining is not None:
                headers["Connect-Timeout-Ms"] = str(max(1, int(remaining * 1000)))
            if self._token:
                headers["Authorization"] = "Bearer " + self._token
            send_err: Optional[BaseException] = None
            try:
                conn.request("POST", path, body=body, headers=headers)
            except (OSError, http.client.HTTPException) as exc:
                send_err = exc  # a node that refused the request early may still have answered
            try:
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                if cancel and cancel.event.is_set():
                    raise _Failure("canceled", "the call was canceled", kind="canceled") from exc
                f = _transport_failure(send_err or exc, send_err is None, self._cert)
                if send_err is not None and f.kind == "unreachable":
                    f.never_sent = True  # an incomplete request never runs
                raise f from exc
        except BaseException:
            conn.close()
            raise
        finally:
            if cancel:
                cancel.attach(None)
        if resp.will_close or send_err is not None:
            conn.close()
        else:
            e.put(conn)
        if resp.status != 200:
            raise _answer_failure(resp.status, data)
        try:
            return json.loads(data) if data else {}
        except ValueError as exc:
            raise _Failure("internal", f"the node answered 200 without JSON: {data[:100]!r}") from exc

    # -- a call with retries (client/retry.go) --

    def _call(self, method: str, rpc: str, req: dict[str, Any], decide: _Decide, *, leader: str = "",
              until: Optional[float] = None, timeout: Optional[float] = None, extra: float = 0.0,
              cancel: Optional[_Cancel] = None, on_failure: Optional[Callable[[_Failure], None]] = None,
              ids: Optional[Callable[[], list[int]]] = None) -> dict[str, Any]:
        """Runs rpc until it succeeds, fails in a way decide does not retry,
        or runs out of attempts (past them, while before until: the lease of
        a claim) or time. on_failure may change req before the next attempt."""
        if self._closed:
            raise NornError(f"norn: {method}: the client is closed", code="canceled", kind="closed", method=method)
        t = self.timeout if timeout is None else timeout
        deadline = None if t is None or t <= 0 else time.monotonic() + t + extra
        if deadline is not None and until is not None:
            until = min(until, deadline)
        prev: Optional[_Endpoint] = None
        tried: dict[str, str] = {}  # base URL: why its last attempt failed
        answer: Optional[tuple[_Failure, _Endpoint]] = None  # the last failure a node answered
        wf: Optional[WriteFailure] = None
        attempt = 0
        while True:
            attempt += 1
            e = self._pick(prev, leader if attempt == 1 else "")
            try:
                out = self._attempt(e, _TASKS + rpc if "/" not in rpc else rpc, json.dumps(req).encode(),
                                    deadline, cancel)
                self._observe(e, None)
                return out
            except _Failure as f:
                self._observe(e, f)
                tried[e.base] = f.message
                answer = answer if f.transport else (f, e)
                wf = f.write_failure or wf
                if on_failure:
                    on_failure(f)
                prev = e
                wait, now = self._backoff(attempt), time.monotonic()
                more = attempt < self.max_attempts or (until is not None and now + wait < until)
                in_time = deadline is None or now + wait < deadline
                if not (more and in_time and decide(f)) or (cancel and cancel.event.is_set()):
                    err = self._error(method, f, e, tried, answer)
                    err.attempts, err.ids, err.write_failure = attempt, ids() if ids else [], err.write_failure or wf
                    raise err from None
                if cancel:
                    cancel.event.wait(wait)
                else:
                    time.sleep(wait)

    def _error(self, method: str, f: _Failure, e: _Endpoint, tried: dict[str, str],
               answer: Optional[tuple[_Failure, _Endpoint]]) -> NornError:
        """The NornError of a call, in words naming what is wrong: its last
        failure, or the last answer of a node when the last attempt reached
        none (that node's failure is added)."""
        then = ""
        if f.transport and answer is not None:
            then = f"; then {e.base}: {f.message}"
            f, e = answer
        common: dict[str, Any] = dict(method=method, node=e.base, details=f.details, write_failure=f.write_failure,
                                      server_message=f.message, http_status=f.status,
                                      retryable=f.retryable() or f.kind == "unreachable")
        if f.kind == "unreachable":
            now = time.monotonic()
            parts = [f"{x.base} ({tried[x.base]})" if x.base in tried else f"{x.base} (not tried" +
                     (f": down after {x.last_error})" if now < x.down_until else ")") for x in self._eps]
            if f.never_sent:
                head = "no node of [" + ", ".join(x.base for x in self._eps) + "] answered: " + ", ".join(parts)
            else:
                head = f"the connection to {e.base} failed: {f.message}"
            return NornError(f"norn: {method}: {head}", code="unavailable", kind="unreachable", **common)
        if f.kind in ("untrusted_node", "certificate_rejected", "certificate_expired", "tls"):
            who = "is not trusted" if f.kind == "untrusted_node" else "failed"
            return NornError(f"norn: {method}: node {e.base} {who}: {f.message}", code=f.code, kind=f.kind, **common)
        kind, explain = f.kind, ""
        if f.code == "unauthenticated":
            explain = ("the node does not accept the bearer token: it is unknown or revoked (nornctl token create "
                       "makes a new one)" if self._token else
                       "the node needs credentials: a client certificate (cert=, key=) or a bearer token (token=)"
                       if not self._cert else "the node does not accept the client's credentials")
        elif f.code == "permission_denied":
            explain = "the caller's grants do not allow this call (nornctl grant)"
        elif f.code == "failed_precondition":
            kind = "superseded"
        elif f.code == "invalid_argument" and "exceeds the limit" in f.message and any(
                w in f.message for w in ("payload", "result", "data")):
            kind, explain = "payload_too_large", "over the node's payload limit (-max-payload-bytes, 1 MiB by default)"
        elif f.code == "resource_exhausted" and not f.over_budget() and "request" in f.message:
            kind, explain = "request_too_large", "the request is over the node's size limit (-max-request-bytes)"
        msg = f"{explain}: {f.message}" if explain else f.message
        return NornError(f"norn: {method}: [{f.code.upper()}] {msg} (node {e.base}){then}", code=f.code, kind=kind,
                         **common)

    def _claim_call(self, method: str, rpc: str, id: int, req: dict[str, Any], *, done: bool = False,
                    timeout: Optional[float] = None, until: Optional[float] = None,
                    cancel: Optional[_Cancel] = None) -> dict[str, Any]:
        """A call on a claim: first to the partition's leader, retried for as
        long as the lease lasts (a failover takes a few seconds)."""
        leader, lease_end = self._hints.get(id, done)
        if until is not None:
            lease_end = until
        if until is not None and timeout is None:
            timeout = max(until - time.monotonic(), 0.001)
        return self._call(method, rpc, req, _idempotent, leader=leader, until=lease_end, timeout=timeout,
                          cancel=cancel)

    # -- TaskService --

    def enqueue(self, task: Union[str, TaskSpec], payload: Bytes = b"", *, priority: int = 0,
                not_before: Optional[When] = None, depends_on: Sequence[int] = (), max_claims: int = 0,
                retry: Optional[RetryPolicy] = None, deadline: Optional[When] = None, unique_key: str = "",
                unique_for: Optional[float] = None, fairness_key: str = "", fairness_weight: int = 0,
                id: int = 0, w: Optional[int] = None, timeout: Optional[float] = None) -> Enqueued:
        """Stores a task (a TaskSpec, or a queue name and the spec's fields)
        and returns its id. With ``id`` the call stores it under that id
        and retries any UNAVAILABLE; without, it retries only when the
        first attempt's WriteFailure names the id the node assigned, and
        then with it. A failed call whose id is known carries it in
        ``NornError.ids``: ``enqueue(..., id=that)`` later is safe."""
        spec = task if isinstance(task, TaskSpec) else TaskSpec(
            task, payload, priority, not_before, depends_on, max_claims, retry, deadline, unique_key, unique_for,
            fairness_key, fairness_weight)
        req: dict[str, Any] = {"task": _encode(spec), "w": self.w if w is None else w}
        if id:
            req["id"] = str(id)

        def learn(f: _Failure) -> None:
            wf = f.write_failure
            if "id" not in req and wf and len(wf.ids) == 1 and wf.ids[0]:
                req["id"] = str(wf.ids[0])

        out = self._call("enqueue", "Enqueue", req, lambda f: _idempotent(f) if "id" in req else _no_effect(f),
                         timeout=timeout, on_failure=learn, ids=lambda: [int(req["id"])] if "id" in req else [])
        return Enqueued(int(out.get("id", 0)), int(out.get("acks", 0)), bool(out.get("duplicate", False)))

    def enqueue_batch(self, specs: Sequence[TaskSpec], *, ids: Optional[Sequence[int]] = None,
                      w: Optional[int] = None, timeout: Optional[float] = None) -> list[int]:
        """Stores up to 10,000 tasks in one call; their ids in order. Retried
        as enqueue, with the ids of the WriteFailure."""
        if not specs or len(specs) > 10_000 or (ids and len(ids) != len(specs)):
            raise NornError("norn: enqueue batch: need 1 to 10,000 specs and no ids or one per spec",
                            code="invalid_argument", kind="bad_config")
        req: dict[str, Any] = {"tasks": [_encode(s) for s in specs], "w": self.w if w is None else w}
        if ids:
            req["ids"] = [str(i) for i in ids]

        def known() -> bool:
            return len(req.get("ids", [])) == len(specs) and all(i != "0" for i in req["ids"])

        def learn(f: _Failure) -> None:
            wf = f.write_failure
            if wf and len(wf.ids) == len(specs) and all(wf.ids) and all(
                    a in ("0", str(b)) for a, b in zip(req.get("ids", ["0"] * len(specs)), wf.ids)):
                req["ids"] = [str(i) for i in wf.ids]

        out = self._call("enqueue batch", "EnqueueBatch", req, lambda f: _idempotent(f) if known() else _no_effect(f),
                         timeout=timeout, on_failure=learn, ids=lambda: [int(i) for i in req["ids"]] if known() else [])
        return [int(i) for i in out.get("ids", [])]

    def get_task(self, id: int, *, r: int = 0, timeout: Optional[float] = None) -> Task:
        """The task with its history, read from ``r`` replicas (0: a majority)."""
        out = self._call("get task", "GetTask", {"id": str(id), "r": r}, _idempotent, timeout=timeout)
        return typing.cast(Task, _decode(Task, out.get("task")))

    def list_tasks(self, queue: str = "", status: str = "", *, page_size: int = 0, page_token: str = "",
                   newest_first: bool = False, depends_on: int = 0, worker: str = "", error_contains: str = "",
                   payload_contains: Bytes = b"", timeout: Optional[float] = None) -> TaskPage:
        """One page of tasks (docs/API.md "ListTasks"); status is READY,
        COMPLETED, ... or empty for all."""
        req: dict[str, Any] = {"queue": queue, "pageSize": page_size, "pageToken": page_token,
                               "newestFirst": newest_first, "worker": worker, "errorContains": error_contains}
        if status:
            req["status"] = "TASK_STATUS_" + status.upper().removeprefix("TASK_STATUS_")
        if depends_on:
            req["dependsOn"] = str(depends_on)
        if payload_contains:
            req["payloadContains"] = _b64(payload_contains)
        out = self._call("list tasks", "ListTasks", req, _idempotent, timeout=timeout)
        return typing.cast(TaskPage, _decode(TaskPage, out))

    def iter_tasks(self, queue: str = "", status: str = "", **filters: Any) -> Iterator[Task]:
        """Every task matching, page after page (list_tasks' filters)."""
        token, size = "", filters.pop("page_size", 1000)
        while True:
            page = self.list_tasks(queue, status, page_size=size, page_token=token, **filters)
            yield from page.tasks
            if not page.next_page_token:
                return
            token = page.next_page_token

    def count_tasks(self, queue: str = "", *, timeout: Optional[float] = None) -> Counts:
        """The tasks of a queue (or all) by status."""
        out = self._call("count tasks", "CountTasks", {"queue": queue}, _idempotent, timeout=timeout)
        return Counts(int(out.get("total", 0)), {k: int(v) for k, v in (out.get("byStatus") or {}).items()})

    def claim(self, queue: str, *, lease: float = 30.0, max: int = 1, wait: float = 0.0,
              worker: Optional[str] = None, timeout: Optional[float] = None,
              _cancel: Optional[_Cancel] = None) -> list[ClaimedTask]:
        """Leases up to ``max`` tasks of ``queue`` for ``lease`` seconds,
        highest priority then oldest first, waiting up to ``wait`` seconds
        for one (long poll); [] if none. Not idempotent: retried only when
        the request provably never reached a node."""
        req: dict[str, Any] = {"queue": queue, "worker": worker or self.worker_name, "max": max,
                               "lease": _dur_out(lease)}
        if wait > 0:
            req["wait"] = _dur_out(wait)
        out = self._call("claim", "Claim", req, _no_effect, timeout=timeout, extra=wait, cancel=_cancel)
        tasks = []
        for ct in out.get("tasks", []):
            t = typing.cast(ClaimedTask, _decode(ClaimedTask, ct))
            self._hints.note(t.task.id, t.leader, _mono_of(t.expiry))
            tasks.append(t)
        return tasks

    def renew(self, id: int, claim_id: int, lease: float = 30.0, *, timeout: Optional[float] = None,
              _until: Optional[float] = None, _cancel: Optional[_Cancel] = None) -> Optional[datetime]:
        """Extends a live claim's lease to ``lease`` seconds from now; the new
        expiry. ``NornError`` kind ``superseded``: the claim ended or the
        task was cancelled, stop working on it."""
        out = self._claim_call("renew", "Renew", id, {"id": str(id), "claimId": str(claim_id),
                               "lease": _dur_out(lease)}, timeout=timeout, until=_until, cancel=_cancel)
        expiry = _ts_in(out.get("expiry"))
        if expiry:
            self._hints.renewed(id, _mono_of(expiry) or 0.0)
        return expiry

    def update(self, id: int, claim_id: int, seq: int, progress: float = 0.0, message: str = "",
               data: Bytes = b"", *, w: Optional[int] = None, timeout: Optional[float] = None) -> None:
        """Records progress (0 to 1), a status line and data under a claim;
        ``seq`` starts at 1 and grows with every update of the claim."""
        req = {"id": str(id), "claimId": str(claim_id), "seq": str(seq), "progress": progress, "message": message,
               "data": _b64(data), "w": self.w if w is None else w}
        self._claim_call("update", "Update", id, req, timeout=timeout)

    def complete(self, id: int, claim_id: int, result: Bytes = b"", *, w: Optional[int] = None,
                 timeout: Optional[float] = None, _until: Optional[float] = None) -> None:
        """Ends the claim and the task as COMPLETED with ``result``."""
        req = {"id": str(id), "claimId": str(claim_id), "result": _b64(result), "w": self.w if w is None else w}
        self._claim_call("complete", "Complete", id, req, done=True, timeout=timeout, until=_until)

    def abort(self, id: int, claim_id: int, code: str = "aborted", description: str = "",
              args: Sequence[str] = (), *, retry: bool = False, w: Optional[int] = None,
              timeout: Optional[float] = None, _until: Optional[float] = None) -> None:
        """Ends the claim with an error: for good (ABORTED), or with
        ``retry=True`` as a failed attempt retried after its backoff (DEAD
        after its last attempt)."""
        req = {"id": str(id), "claimId": str(claim_id), "retry": retry, "w": self.w if w is None else w,
               "errors": [{"code": code, "description": description, "args": list(args)}]}
        self._claim_call("fail" if retry else "abort", "Abort", id, req, done=True, timeout=timeout, until=_until)

    def fail(self, id: int, claim_id: int, code: str = "failed", description: str = "",
             args: Sequence[str] = (), **kw: Any) -> None:
        """abort(..., retry=True): a failed attempt."""
        self.abort(id, claim_id, code, description, args, retry=True, **kw)

    def yield_task(self, id: int, claim_id: int, progress: float = 0.0, *, timeout: Optional[float] = None) -> None:
        """Ends the claim and makes the task READY again at once."""
        self._claim_call("yield", "Yield", id, {"id": str(id), "claimId": str(claim_id), "progress": progress},
                         done=True, timeout=timeout)

    def cancel(self, id: int, *, w: Optional[int] = None, timeout: Optional[float] = None) -> None:
        """Ends a task that has not ended as CANCELLED (again: no change)."""
        self._call("cancel", "Cancel", {"id": str(id), "w": self.w if w is None else w}, _idempotent,
                   timeout=timeout)

    def retry(self, id: int, life: Optional[int] = None, *, w: Optional[int] = None,
              timeout: Optional[float] = None) -> int:
        """Gives a DEAD, ABORTED or CANCELLED task a new life; the life now.
        ``life``: the life read terminal (a repeated retry changes nothing)."""
        req: dict[str, Any] = {"id": str(id), "w": self.w if w is None else w}
        if life is not None:
            req["life"] = life
        return int(self._call("retry", "Retry", req, _idempotent, timeout=timeout).get("life", 0))

    def call(self, procedure: str, request: dict[str, Any], *, idempotent: bool = False,
             timeout: Optional[float] = None) -> dict[str, Any]:
        """Any other call, as proto3 JSON: ``call("norn.v1.QueueService/SetQueue",
        {...})``. Retried on UNAVAILABLE only when ``idempotent``."""
        return self._call(procedure, "/" + procedure.lstrip("/"), request,
                          _idempotent if idempotent else _no_effect, timeout=timeout)


# --------------------------------------------------------------------------
# Worker


class Permanent(Exception):
    """Raise from a handler (or ``raise Permanent(e) from e``) for a failure
    no retry can fix: the task is ABORTED for good instead of retried."""


class TaskFailure(Exception):
    """Raise from a handler to choose the error's code, description and
    args (wrap it in Permanent to abort for good)."""

    def __init__(self, code: str, description: str = "", args: Sequence[str] = ()) -> None:
        super().__init__(f"{code}: {description}" if description else code)
        self.code, self.description, self.error_args = code, description, list(args)


class YieldTask(Exception):
    """Raise from a handler to give the task back for another claim."""


class WorkerShutdown(Exception):
    """Job.cause when the worker is stopping."""


class LeaseExpired(Exception):
    """Job.cause when no renew succeeded before the lease ran out."""


class Job:
    """A claimed task as a handler sees it. ``stopped`` is set when the
    handler should return soon: the claim ended or the task was cancelled
    (``cause`` a NornError, kind superseded), the lease ran out
    (LeaseExpired), or the worker is stopping (WorkerShutdown)."""

    def __init__(self, client: Client, ct: ClaimedTask) -> None:
        self.id, self.claim_id, self.task, self.leader = ct.task.id, ct.claim_id, ct.task, ct.leader
        self.payload: bytes = bytes(ct.task.spec.payload)  # type: ignore[arg-type]
        self.stopped = threading.Event()
        self.cause: Optional[BaseException] = None
        self.claim_gone = False
        self._client, self._lock = client, threading.Lock()
        self._seq = self._ok_seq = 0
        self._progress = 0.0  # of the greatest seq the node accepted

    def text(self) -> str:
        """The payload as UTF-8 text."""
        return self.payload.decode()

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.payload)

    def stop(self, cause: BaseException) -> None:
        if not self.stopped.is_set():
            self.cause = cause
            self.stopped.set()

    def update(self, progress: float, message: str = "", data: Bytes = b"") -> None:
        """Records progress under the claim (its seq is counted for you)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        try:
            self._client.update(self.id, self.claim_id, seq, progress, message, data)
        except NornError as e:
            if e.code == "failed_precondition":
                self.claim_gone = True
                self.stop(e)
            raise
        with self._lock:
            if seq > self._ok_seq:
                self._ok_seq, self._progress = seq, progress

    progress = update


Handler = Callable[[Job], Union[bytes, str, None, Any]]


class Worker:
    """Claims tasks of ``queue`` and runs ``handler(job)`` on each, up to
    ``concurrency`` at once, each in its own thread, renewing the lease
    about every lease/3 while it runs (client/worker.go's contract):

    - returns: Complete with its value (bytes; str as UTF-8; None empty;
      anything else as JSON), also while stopping;
    - raises Permanent: Abort (ABORTED for good); raises anything else: Fail,
      a failed attempt retried after the task's backoff (DEAD after its
      last). The error is TaskFailure's code or ``handler_error``, with the
      exception's text;
    - raises YieldTask, or raises after ``job.stopped`` was set: Yield;
    - the claim ended while it ran (a renew said so): nothing; the lease ran
      out before a renew succeeded: Yield, never Complete.

    ``run()`` blocks until ``stop()`` or SIGINT/SIGTERM (when called in the
    main thread with ``handle_signals``): it stops claiming (the claim in
    flight is abandoned), sets every job's ``stopped``, waits for the
    handlers and settles their tasks as above, so the tasks still held are
    yielded back at once. A second signal acts as the default one. A claim
    failing with an error retrying cannot fix (bad argument, credentials,
    certificate, a closed client) stops the worker, and run() raises it.
    """

    def __init__(self, client: Client, queue: str, handler: Handler, *, concurrency: int = 1, lease: float = 30.0,
                 wait: float = 20.0, name: Optional[str] = None, handle_signals: bool = True) -> None:
        if not queue or handler is None or not 1 <= concurrency <= 10_000 or lease < 0.1 or wait < 0:
            raise NornError("norn: Worker needs a queue, a handler, 1 <= concurrency <= 10,000, lease >= 0.1 s",
                            code="invalid_argument", kind="bad_config")
        self.client, self.queue, self.handler = client, queue, handler
        self.concurrency, self.lease, self.wait = concurrency, lease, wait
        self.name = name or client.worker_name
        self.handle_signals = handle_signals
        self._stopping = threading.Event()
        self._claim_cancel = _Cancel()
        self._cond = threading.Condition()
        self._jobs: set[Job] = set()
        self._threads: set[threading.Thread] = set()
        self._bg: Optional[threading.Thread] = None
        self._bg_error: Optional[BaseException] = None

    def start(self) -> Worker:
        """Runs the worker in a background thread (no signal handling)."""
        def bg() -> None:
            try:
                self.run(handle_signals=False)
            except BaseException as e:  # kept for stop()
                self._bg_error = e
        self._bg = threading.Thread(target=bg, name=f"norn-worker-{self.queue}", daemon=True)
        self._bg.start()
        return self

    def stop(self, wait: bool = True, timeout: Optional[float] = None) -> None:
        """Stops claiming and has run() settle what it holds; with ``wait``,
        waits for a start()ed worker to finish (raising its error)."""
        self._stopping.set()
        self._claim_cancel.cancel()
        with self._cond:
            self._cond.notify_all()
        if wait and self._bg is not None:
            self._bg.join(timeout)
            if self._bg_error is not None:
                raise self._bg_error

    def run(self, handle_signals: Optional[bool] = None) -> None:
        """Claims and handles tasks until stop() or a signal, then settles
        the held tasks and returns."""
        signals = self.handle_signals if handle_signals is None else handle_signals
        if not (signals and threading.current_thread() is threading.main_thread()):
            return self._loop()
        # The loop runs in a thread of its own: the main thread only joins
        # it, so the signal handler (which runs in the main thread) never
        # waits for a lock the main thread holds.
        old: dict[int, Any] = {}

        def on_signal(signum: int, frame: object) -> None:
            log.info("norn: worker stopping on signal %d", signum)
            for s, h in old.items():  # a second signal acts as before
                signal.signal(s, h)
            self.stop(wait=False)

        for s in (signal.SIGINT, signal.SIGTERM):
            old[s] = signal.signal(s, on_signal)
        errs: list[BaseException] = []

        def loop() -> None:
            try:
                self._loop()
            except BaseException as e:
                errs.append(e)

        t = threading.Thread(target=loop, name=f"norn-worker-{self.queue}", daemon=True)
        try:
            t.start()
            while t.is_alive():
                t.join(0.2)
        finally:  # also on a second SIGINT's KeyboardInterrupt: stop waiting
            self.stop(wait=False)
            for s, h in old.items():
                signal.signal(s, h)
        if errs:
            raise errs[0]

    def _loop(self) -> None:
        failures, err = 0, None
        try:
            while not self._stopping.is_set():
                with self._cond:
                    while len(self._jobs) >= self.concurrency and not self._stopping.is_set():
                        self._cond.wait(0.5)
                    n = min(self.concurrency - len(self._jobs), 1000)
                if self._stopping.is_set():
                    break
                sent = time.monotonic()
                try:
                    claimed = self.client.claim(self.queue, lease=self.lease, max=n, wait=self.wait,
                                                worker=self.name, _cancel=self._claim_cancel)
                except NornError as e:
                    if self._stopping.is_set():
                        break
                    if e.code in ("invalid_argument", "permission_denied", "unauthenticated", "unimplemented") \
                            or e.kind in ("untrusted_node", "certificate_rejected", "certificate_expired", "tls",
                                          "bad_config", "closed"):
                        log.error("norn: claim failed; stopping the worker: %s", e)
                        err = e
                        break
                    failures += 1
                    log.warning("norn: claim failed (%d in a row); retrying: %s", failures, e)
                    self._stopping.wait(self.client._backoff(failures))
                    continue
                failures = 0
                for ct in claimed:
                    self._spawn(ct, sent)
                if not claimed and time.monotonic() - sent < self.wait / 2:
                    self._stopping.wait(self.client.base_backoff)  # an early empty answer: do not spin
        finally:
            self._stopping.set()
            with self._cond:
                jobs, threads = list(self._jobs), list(self._threads)
            for j in jobs:
                j.stop(WorkerShutdown("norn: worker shutting down"))
            for t in threads:
                t.join()
        if err is not None:
            raise err

    def _spawn(self, ct: ClaimedTask, sent: float) -> None:
        job = Job(self.client, ct)
        t = threading.Thread(target=self._run_job, args=(job, sent), name=f"norn-task-{job.id}", daemon=True)
        with self._cond:
            self._jobs.add(job)
            self._threads.add(t)
        t.start()

    def _run_job(self, job: Job, sent: float) -> None:
        try:
            if self._stopping.is_set():
                self._settle(job, "yield", b"", None, None)
                return
            lease_end = [sent + self.lease]  # by this process's clock, at the latest
            done, renew_cancel = threading.Event(), _Cancel()
            renewer = threading.Thread(target=self._renew, args=(job, sent, lease_end, done, renew_cancel),
                                       daemon=True, name=f"norn-renew-{job.id}")
            renewer.start()
            result, exc = b"", None
            try:
                result = _result_bytes(self.handler(job))
            except BaseException as e:  # noqa: B036 (a handler thread must settle whatever happened)
                exc = e
                if not isinstance(e, YieldTask):
                    log.warning("norn: handler of task %d raised %s: %s", job.id, type(e).__name__, e,
                                exc_info=not isinstance(e, (Permanent, TaskFailure)))
            done.set()
            renew_cancel.cancel()  # a renew in flight would hold the settle up
            renewer.join()
            if job.claim_gone:
                log.info("norn: the claim of task %d ended while the handler ran: %s", job.id, job.cause)
                return
            if isinstance(job.cause, LeaseExpired) or time.monotonic() >= lease_end[0]:
                log.warning("norn: the lease of task %d ran out before the handler returned; yielding", job.id)
                outcome = "yield"
            elif exc is None:
                outcome = "complete"
            elif job.stopped.is_set() or isinstance(exc, YieldTask):
                outcome = "yield"
            else:
                outcome = "abort" if isinstance(exc, Permanent) else "fail"
            self._settle(job, outcome, result, exc, lease_end[0])
        finally:
            with self._cond:
                self._jobs.discard(job)
                self._threads.discard(threading.current_thread())
                self._cond.notify_all()

    def _renew(self, job: Job, sent: float, lease_end: list[float], done: threading.Event, cancel: _Cancel) -> None:
        """Renews about every lease/3 until done; tells the job when the claim
        has ended or the lease ran out first."""
        interval = self.lease / 3
        wait = max(sent + interval - time.monotonic(), 0)
        while not done.wait(wait):
            t0, deadline = time.monotonic(), lease_end[0]
            try:
                self.client.renew(job.id, job.claim_id, self.lease, _until=deadline, _cancel=cancel)
                lease_end[0] = t0 + self.lease
                wait = interval
            except NornError as e:
                if done.is_set():
                    return
                if e.code == "failed_precondition":
                    job.claim_gone = True
                    job.stop(e)
                    return
                if time.monotonic() >= deadline:
                    log.warning("norn: lease of task %d ran out before a renew succeeded: %s", job.id, e)
                    job.stop(LeaseExpired("norn: lease ran out before it could be renewed"))
                    return
                log.warning("norn: renew of task %d failed; retrying: %s", job.id, e)
                wait = min(interval / 3, max(deadline - time.monotonic(), 0))

    def _settle(self, job: Job, outcome: str, result: bytes, exc: Optional[BaseException],
                until: Optional[float]) -> None:
        """Ends the claim as outcome says; a failure is logged (the lease then
        expires and the task is claimed again)."""
        c = self.client
        try:
            if outcome == "complete":
                c.complete(job.id, job.claim_id, result, _until=until)
            elif outcome == "yield":
                c.yield_task(job.id, job.claim_id, job._progress)
            else:
                code, desc, args = _abort_error(exc)
                c.abort(job.id, job.claim_id, code, desc, args, retry=outcome == "fail", _until=until)
        except NornError as e:
            log.warning("norn: could not %s task %d; its lease will expire: %s", outcome, job.id, e)


def _result_bytes(v: Any) -> bytes:
    """A handler's return value as the task's result."""
    if v is None:
        return b""
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode()
    return json.dumps(v).encode()


def _abort_error(exc: Optional[BaseException]) -> tuple[str, str, list[str]]:
    """The code, description and args of an abort for a handler's exception:
    a TaskFailure's (also wrapped in Permanent), else handler_error and the
    exception's text (its type's name when it has none), at most 16 KiB."""
    inner = exc.args[0] if isinstance(exc, Permanent) and exc.args and isinstance(exc.args[0], BaseException) else exc
    if isinstance(inner, TaskFailure):
        return inner.code or "handler_error", inner.description[:16384], inner.error_args
    text = str(inner) if inner is not None else ""
    return "handler_error", (text or type(inner).__name__)[:16384], []
