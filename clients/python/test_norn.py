"""Tests of norn.py against real nornd processes, with unittest only.

setUpClass starts a 3-node cluster with TLS and a single node with an
access file, from the built binaries (bin/nornd and bin/nornctl at the
repository root, or $NORN_BIN), on free 127.0.0.1 ports in a temporary
directory; class cleanup stops exactly those processes, by pid, whatever
happened. NORN_KEEP=1 keeps the directory (data, logs).

    cd clients/python && python3 -m unittest -v test_norn
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import http.client
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from datetime import datetime, timedelta, timezone
from typing import Callable, Optional
from unittest import mock

import norn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# Flags that keep a test cluster quick on a small machine.
QUICK = ["-partitions", "16", "-handover-timeout", "0", "-lease-grace", "3s", "-write-timeout", "2s",
         "-log-level", "warn"]


def read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def bin_dir() -> str:
    """The directory of nornd and nornctl; fails naming what is missing."""
    d = os.path.abspath(os.environ.get("NORN_BIN") or os.path.join(ROOT, "bin"))
    for b in ("nornd", "nornctl"):
        if not os.access(os.path.join(d, b), os.X_OK):
            raise RuntimeError(f"{os.path.join(d, b)} is missing or not executable: build the binaries at the "
                               "repository root with 'make build' (or go build -o bin/nornd ./cmd/nornd && go build "
                               "-o bin/nornctl ./cmd/nornctl), or set NORN_BIN to the directory holding them")
    return d


def nornctl(*args: str) -> str:
    return subprocess.run([os.path.join(bin_dir(), "nornctl"), *args], check=True, capture_output=True, text=True,
                          timeout=30).stdout


# Every nornd the tests started and have not seen exit: killed if the test
# process ends early (an exception, or SIGTERM from a CI timeout).
_live: dict[int, subprocess.Popen] = {}


def _kill_live() -> None:
    for pid, p in list(_live.items()):
        if p.poll() is None:
            p.kill()
            p.wait()
        _live.pop(pid, None)


atexit.register(_kill_live)
for _sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, lambda s, f: sys.exit(128 + s))


def free_ports(n: int) -> list[int]:
    """n distinct ports free on 127.0.0.1 for TCP and UDP (gossip uses both),
    below the kernel's ephemeral range so no outgoing connection takes one
    before the node binds it."""
    try:
        low = int(read("/proc/sys/net/ipv4/ip_local_port_range").split()[0])
    except (OSError, ValueError):
        low = 32768
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            port = random.randrange(10_000, low)
            if port in ports:
                continue
            t, u = socket.socket(socket.AF_INET, socket.SOCK_STREAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                t.bind(("127.0.0.1", port))
                u.bind(("127.0.0.1", port))
            except OSError:
                t.close()
                u.close()
                continue
            held += [t, u]
            ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


class Certs:
    """A CA, a gossip key, a client certificate "admin" and node
    certificates, made with nornctl cert in dir."""

    def __init__(self, dir: str, nodes: list[str], name: str = "Norn test CA") -> None:
        self.dir = dir
        nornctl("cert", "create-ca", "--dir", dir, "--name", name)
        nc = os.path.join(bin_dir(), "nornctl")
        cmds = [["cert", "create-gossip-key", "--dir", dir], ["cert", "create-client", "admin", "--dir", dir]]
        cmds += [["cert", "create-node", n, "--host", "127.0.0.1,localhost", "--dir", dir] for n in nodes]
        procs = [subprocess.Popen([nc, *c], stdout=subprocess.DEVNULL) for c in cmds]
        for p in procs:
            if p.wait(30) != 0:
                raise RuntimeError(f"nornctl {p.args} failed")
        self.ca, self.ca_key = os.path.join(dir, "ca.crt"), os.path.join(dir, "ca.key")
        self.gossip_key = os.path.join(dir, "gossip.key")
        self.cert, self.key = os.path.join(dir, "client-admin.crt"), os.path.join(dir, "client-admin.key")


class Node:
    def __init__(self, id: str, api: str, proc: subprocess.Popen, log: str) -> None:
        self.id, self.api, self.proc, self.log = id, api, proc, log


class Cluster:
    """nornd processes started with scripts/cluster.sh's flags."""

    def __init__(self, certs: Certs, n: int = 3, auth_file: Optional[str] = None, name: str = "cluster") -> None:
        self.certs, self.nodes = certs, []
        for attempt in range(3):
            self.dir = tempfile.mkdtemp(prefix=f"norn-py-{name}-")
            try:
                self._spawn(n, auth_file)
                self.wait_healthy(60)
                return
            except Exception:
                in_use = any("address already in use" in read(x.log) for x in self.nodes)
                self.stop()
                if not in_use or attempt == 2:
                    raise

    def _spawn(self, n: int, auth_file: Optional[str]) -> None:
        ids = [f"n{i + 1}" for i in range(n)]
        ports = free_ports(3 * n)
        gossip = [f"127.0.0.1:{ports[3 * i + 2]}" for i in range(n)]
        c = self.certs
        for i, id in enumerate(ids):
            api = f"127.0.0.1:{ports[3 * i]}"
            args = [os.path.join(bin_dir(), "nornd"), "-node-id", id, "-machine-id", str(i + 1),
                    "-data-dir", os.path.join(self.dir, f"node{i + 1}"), "-listen", api,
                    "-raft-addr", f"127.0.0.1:{ports[3 * i + 1]}", "-gossip-addr", gossip[i],
                    "-bootstrap-expect", str(n), "-tls-ca", c.ca, "-tls-cert", os.path.join(c.dir, f"node-{id}.crt"),
                    "-tls-key", os.path.join(c.dir, f"node-{id}.key"), "-gossip-key", c.gossip_key, *QUICK]
            if n > 1:
                args += ["-join", ",".join(g for j, g in enumerate(gossip) if j != i)]
            if auth_file:
                args += ["-auth-file", auth_file]
            log = os.path.join(self.dir, f"node{i + 1}.log")
            with open(log, "ab") as f:
                p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            _live[p.pid] = p
            self.nodes.append(Node(id, api, p, log))

    @property
    def addrs(self) -> list[str]:
        return [x.api for x in self.nodes]

    def healthy(self, api: str) -> bool:
        ctx = ssl.create_default_context(cafile=self.certs.ca)
        ctx.load_cert_chain(self.certs.cert, self.certs.key)
        host, port = api.rsplit(":", 1)
        conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=2)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def wait_healthy(self, timeout: float) -> None:
        until = time.monotonic() + timeout
        while True:
            for x in self.nodes:
                if x.proc.poll() is not None:
                    tail = read(x.log)[-2000:]
                    raise RuntimeError(f"nornd {x.id} exited ({x.proc.returncode}); the end of {x.log}:\n{tail}")
            if all(self.healthy(x.api) for x in self.nodes):
                return
            if time.monotonic() > until:
                raise RuntimeError(f"the cluster in {self.dir} was not healthy within {timeout} s")
            time.sleep(0.2)

    def kill9(self, node: Node) -> None:
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()
        _live.pop(node.proc.pid, None)

    def stop(self) -> None:
        """SIGTERM to exactly these processes, SIGKILL after 5 s."""
        for x in self.nodes:
            if x.proc.poll() is None:
                x.proc.terminate()
        for x in self.nodes:
            try:
                x.proc.wait(5)
            except subprocess.TimeoutExpired:
                x.proc.kill()
                x.proc.wait()
            _live.pop(x.proc.pid, None)
        if not os.environ.get("NORN_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)


# -- An expired certificate, with the standard library alone: the admin
# certificate's TBS with a validity in the past, signed again with the CA's
# ECDSA P-256 key (a few lines of DER and curve arithmetic).

P256_P = 2**256 - 2**224 + 2**192 + 2**96 - 1
P256_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
P256_G = (0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
          0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5)


def _ec_add(a: Optional[tuple[int, int]], b: Optional[tuple[int, int]]) -> Optional[tuple[int, int]]:
    if a is None or b is None:
        return a or b
    if a[0] == b[0] and (a[1] + b[1]) % P256_P == 0:
        return None
    if a == b:
        m = (3 * a[0] * a[0] - 3) * pow(2 * a[1], -1, P256_P)
    else:
        m = (b[1] - a[1]) * pow(b[0] - a[0], -1, P256_P)
    x = (m * m - a[0] - b[0]) % P256_P
    return x, (m * (a[0] - x) - a[1]) % P256_P


def _ec_mul(k: int, pt: tuple[int, int]) -> tuple[int, int]:
    out: Optional[tuple[int, int]] = None
    add: Optional[tuple[int, int]] = pt
    while k:
        if k & 1:
            out = _ec_add(out, add)
        add, k = _ec_add(add, add), k >> 1
    assert out is not None
    return out


def _der(b: bytes, i: int = 0) -> tuple[int, int, int]:
    """(tag, start of content, end) of the DER element at i."""
    tag, n = b[i], b[i + 1]
    i += 2
    if n & 0x80:
        k = n & 0x7F
        n, i = int.from_bytes(b[i:i + k], "big"), i + k
    return tag, i, i + n


def _children(b: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(b):
        _, s, e = _der(b, i)
        out.append(b[i:e])
        i = e
    return out


def _tlv(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    ln = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(ln)]) + ln + content


def _pem(path: str) -> bytes:
    with open(path) as f:
        return base64.b64decode("".join(l for l in f.read().splitlines() if not l.startswith("-----")))


def make_expired_cert(certs: Certs, out: str) -> None:
    """Writes to out the admin client certificate expired a day ago (its key
    is certs.key)."""
    cert = _pem(certs.cert)
    _, s, e = _der(cert)
    tbs_der, sig_alg, _ = _children(cert[s:e])
    _, s, e = _der(tbs_der)
    parts = _children(tbs_der[s:e])
    now = datetime.now(timezone.utc)
    ut = [_tlv(0x17, (now - timedelta(days=d)).strftime("%y%m%d%H%M%SZ").encode()) for d in (2, 1)]
    parts[4] = _tlv(0x30, b"".join(ut))  # [0] version, serial, sigAlg, issuer, validity
    tbs = _tlv(0x30, b"".join(parts))
    # The CA's PKCS#8 key: SEQUENCE { 0, alg, OCTET STRING { SEQUENCE { 1, OCTET STRING d, ... } } }
    k = _pem(certs.ca_key)
    for i in (2, 1):  # the OCTET STRING, then the ECPrivateKey's d
        _, s, e = _der(k)
        k = _children(k[s:e])[i]
        _, s, e = _der(k)
        k = k[s:e]
    d = int.from_bytes(k, "big")
    z = int.from_bytes(hashlib.sha256(tbs).digest(), "big")
    while True:
        kk = secrets.randbelow(P256_N - 1) + 1
        r = _ec_mul(kk, P256_G)[0] % P256_N
        sig = pow(kk, -1, P256_N) * (z + r * d) % P256_N
        if r and sig:
            break
    ints = _tlv(0x02, _int_bytes(r)) + _tlv(0x02, _int_bytes(sig))
    der = _tlv(0x30, tbs + sig_alg + _tlv(0x03, b"\0" + _tlv(0x30, ints)))
    b64 = base64.b64encode(der).decode()
    with open(out, "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\n" + "\n".join(b64[i:i + 64] for i in range(0, len(b64), 64))
                + "\n-----END CERTIFICATE-----\n")


def _int_bytes(v: int) -> bytes:
    """A positive DER INTEGER's content."""
    b = v.to_bytes((v.bit_length() + 7) // 8, "big")
    return b"\0" + b if b[0] & 0x80 else b


# -- The tests


def wait_terminal(c: norn.Client, ids: list[int], timeout: float) -> dict[int, norn.Task]:
    until, done = time.monotonic() + timeout, {}
    while True:
        for id in ids:
            if id not in done:
                try:
                    t = c.get_task(id)
                except norn.NornError:
                    continue
                if t.status in norn.TERMINAL:
                    done[id] = t
        if len(done) == len(ids):
            return done
        left = [i for i in ids if i not in done]
        if time.monotonic() > until:
            raise AssertionError(f"{len(left)} of {len(ids)} tasks not terminal after {timeout} s: {left[:5]}")
        time.sleep(0.2)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    until = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > until:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.02)


class ErrorModelTest(unittest.TestCase):
    """What a node's answers mean for retries, without a cluster."""

    def test_over_budget(self) -> None:
        told = norn._Failure("resource_exhausted", "the node is busy", details=[{"type": "google.rpc.RetryInfo", "value": ""}])
        self.assertTrue(told.over_budget(), "a RetryInfo detail says the call did not run")
        self.assertTrue(told.retryable())
        self.assertTrue(norn._Failure("resource_exhausted", "no room now; retry later").over_budget(), "an older node's message")
        too_big = norn._Failure("resource_exhausted", "request of 99 bytes exceeds the limit of 9")
        self.assertFalse(too_big.over_budget())
        self.assertFalse(too_big.retryable())


class ClusterTest(unittest.TestCase):
    cluster: Cluster
    auth: Cluster
    certs: Certs
    client: norn.Client
    dir: str
    auth_file: str
    token: str

    @classmethod
    def setUpClass(cls) -> None:
        t0 = time.monotonic()
        cls.dir = tempfile.mkdtemp(prefix="norn-py-test-")
        if not os.environ.get("NORN_KEEP"):
            cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.certs = Certs(os.path.join(cls.dir, "certs"), ["n1", "n2", "n3"])
        # The single node's access file: the admin certificate may do
        # everything; user "ci" (a token) may enqueue into "jobs".
        cls.auth_file = os.path.join(cls.dir, "auth.json")
        nornctl("grant", "admin", "admin", "--auth-file", cls.auth_file)
        nornctl("grant", "ci", "producer", "--queues", "jobs", "--auth-file", cls.auth_file)
        cls.token = nornctl("token", "create", "ci", "--auth-file", cls.auth_file).strip()
        started: dict[str, Cluster] = {}
        errors: list[BaseException] = []

        def start(name: str, **kw: object) -> None:
            try:
                started[name] = Cluster(cls.certs, name=name, **kw)  # type: ignore[arg-type]
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=start, args=("three",)),
                   threading.Thread(target=start, args=("auth",), kwargs={"n": 1, "auth_file": cls.auth_file})]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in started.values():
            cls.addClassCleanup(c.stop)
        if errors:
            raise errors[0]
        cls.cluster, cls.auth = started["three"], started["auth"]
        cls.client = cls.new_client()
        print(f"\n(clusters up in {time.monotonic() - t0:.1f} s: {cls.cluster.dir}, {cls.auth.dir})", file=sys.stderr)

    @classmethod
    def new_client(cls, **kw: object) -> norn.Client:
        opts: dict[str, object] = dict(ca=cls.certs.ca, cert=cls.certs.cert, key=cls.certs.key)
        opts.update(kw)
        c = norn.Client(cls.cluster.addrs, **opts)  # type: ignore[arg-type]
        cls.addClassCleanup(c.close)
        return c

    def test_01_round_trip(self) -> None:
        c = self.client
        id = c.enqueue("roundtrip", b"hello", priority=3)
        self.assertIsInstance(id, int)
        self.assertGreater(id, 2**32, "a 64-bit id, as an int")
        self.assertGreaterEqual(id.acks, 2)
        claimed = c.claim("roundtrip", lease=2, wait=2, worker="py-test")
        self.assertEqual(len(claimed), 1)
        ct = claimed[0]
        self.assertEqual(ct.task.id, id)
        self.assertEqual(ct.task.spec.payload, b"hello")
        self.assertEqual(ct.task.status, "CLAIMED")
        self.assertIn(ct.leader, self.cluster.addrs)

        expiry = c.renew(id, ct.claim_id, 5)
        assert expiry is not None
        self.assertGreater(expiry, datetime.now(timezone.utc) + timedelta(seconds=3))
        c.update(id, ct.claim_id, 1, 0.5, "half way", b"checkpoint")
        c.complete(id, ct.claim_id, "done")

        t = c.get_task(id)
        self.assertEqual(t.status, "COMPLETED")
        self.assertEqual(t.result, b"done")
        self.assertEqual(t.spec.priority, 3)
        self.assertEqual([(x.worker, x.end_reason) for x in t.claims], [("py-test", "COMPLETED")])
        u = t.updates[0]
        self.assertEqual((u.seq, u.progress, u.message, u.data), (1, 0.5, "half way", b"checkpoint"))
        self.assertEqual(c.count_tasks("roundtrip").by_status.get("COMPLETED"), 1)
        self.assertEqual([x.id for x in c.iter_tasks("roundtrip")], [id])

        with self.assertRaises(norn.NornError) as cm:  # the claim has ended
            c.renew(id, ct.claim_id, 1)
        self.assertEqual((cm.exception.code, cm.exception.kind), ("failed_precondition", "superseded"))
        self.assertFalse(cm.exception.retryable)
        self.assertEqual(c.enqueue("roundtrip", b"hello", priority=3, id=id), id, "an idempotent retry")
        with self.assertRaises(norn.NornError) as cm:
            c.enqueue("roundtrip", b"other", id=id)
        self.assertEqual(cm.exception.code, "already_exists")

    def test_02_spec_yield_cancel_retry(self) -> None:
        c = self.client
        dep = c.enqueue("spec", "dep")
        later = datetime.now(timezone.utc) + timedelta(hours=1)
        spec = norn.TaskSpec("spec", b"\x00\xffbinary", priority=-2, not_before=later, depends_on=[dep],
                             retry=norn.RetryPolicy(4, 0.5, 10, 2, 0.1), unique_key="k-" + secrets.token_hex(4),
                             fairness_key="tenant", fairness_weight=3, deadline=timedelta(days=1))
        id = c.enqueue(spec)
        again = c.enqueue(norn.TaskSpec("spec", b"another", unique_key=spec.unique_key))
        self.assertEqual((again, again.duplicate), (id, True), "a held unique key answers the holder")
        t = c.get_task(id)
        self.assertEqual(t.status, "DELAYED")
        self.assertEqual((t.spec.payload, t.spec.priority, t.spec.depends_on), (b"\x00\xffbinary", -2, [dep]))
        self.assertEqual(t.spec.retry, norn.RetryPolicy(4, 0.5, 10.0, 2.0, 0.1))
        self.assertAlmostEqual(t.spec.not_before.timestamp(), later.timestamp(), delta=0.01)  # type: ignore[union-attr]
        self.assertEqual((t.spec.fairness_key, t.spec.fairness_weight), ("tenant", 3))

        [ct] = c.claim("spec", lease=5, wait=2)  # the dependency
        self.assertEqual(ct.task.id, dep)
        c.yield_task(dep, ct.claim_id, 0.25)
        t = c.get_task(dep)
        self.assertEqual((t.status, t.claims[0].end_reason, t.progress), ("READY", "YIELDED", 0.25))
        c.cancel(dep)
        c.cancel(dep)  # again: no change
        self.assertEqual(c.get_task(dep).status, "CANCELLED")
        self.assertEqual(c.retry(dep, life=0), 1)
        self.assertEqual(c.retry(dep, life=0), 1, "a repeated retry changes nothing")
        self.assertEqual(c.get_task(dep).status, "READY")
        c.cancel(id)
        self.assertEqual(c.get_task(id).status, "CANCELLED")
        with self.assertRaises(norn.NornError) as cm:
            c.get_task(12345)
        self.assertEqual(cm.exception.code, "not_found")

    def test_03_worker(self) -> None:
        c, queue, lease = self.client, "work", 1.2
        plain = c.enqueue_batch([norn.TaskSpec(queue, f"plain-{i}") for i in range(10)])
        bad = c.enqueue(queue, "permanent")
        flaky = c.enqueue(queue, "flaky", retry=norn.RetryPolicy(max_attempts=3, initial_backoff=0.1))
        slow = c.enqueue(queue, "slow")
        doomed = c.enqueue(queue, "cancel-me")
        runs = {"flaky": 0}
        seen: dict[str, object] = {}

        def handler(job: norn.Job) -> object:
            p = job.text()
            if p == "permanent":
                raise norn.Permanent("cannot parse the payload: bad JSON at byte 3")
            if p == "flaky":
                runs["flaky"] += 1
                if runs["flaky"] == 1:
                    raise OSError("flaky: disk full on /var/tmp")
            if p == "slow":
                job.progress(0.1, "starting")
                time.sleep(lease * 2.5)  # past its lease: the worker must renew
                seen["slow_stopped"] = job.stopped.is_set()
                job.progress(0.9, "nearly")
            if p == "cancel-me":
                seen["doomed_started"] = True
                seen["doomed_stopped"] = job.stopped.wait(10)
                seen["doomed_cause"] = job.cause
                return "never stored"
            return {"done": p}

        w = norn.Worker(self.new_client(), queue, handler, concurrency=5, lease=lease, wait=1).start()
        try:
            wait_for(lambda: "doomed_started" in seen, 10, "the cancel-me task started")
            c.cancel(doomed)
            got = wait_terminal(c, [*plain, bad, flaky, slow, doomed], 20)
        finally:
            w.stop()
        for i, id in enumerate(plain):
            self.assertEqual((got[id].status, got[id].result), ("COMPLETED", b'{"done": "plain-%d"}' % i))
        b = got[bad]
        self.assertEqual(b.status, "ABORTED", "Permanent aborts for good")
        self.assertEqual((b.errors[0].code, b.errors[0].description),
                         ("handler_error", "cannot parse the payload: bad JSON at byte 3"))
        f = got[flaky]
        self.assertEqual(f.status, "COMPLETED", "a raise fails the attempt; the retry completes")
        self.assertEqual([x.end_reason for x in f.claims], ["FAILED", "COMPLETED"])
        attempt = [e for e in f.errors if e.attempt == 1]
        self.assertEqual([(e.code, e.description) for e in attempt], [("handler_error", "flaky: disk full on /var/tmp")])
        s = got[slow]
        self.assertEqual((s.status, s.result), ("COMPLETED", b'{"done": "slow"}'))
        self.assertFalse(seen["slow_stopped"], "the slow handler was not stopped")
        self.assertEqual(len(s.claims), 1, "one claim: it never expired")
        held = s.claims[0].expiry - s.claims[0].start  # type: ignore[operator]
        self.assertGreaterEqual(held.total_seconds(), 2.5, "the lease was renewed")
        self.assertEqual([u.message for u in s.updates], ["starting", "nearly"])
        self.assertEqual(got[doomed].status, "CANCELLED")
        self.assertTrue(seen["doomed_stopped"], "the handler of a cancelled task was told to stop")
        self.assertIsInstance(seen["doomed_cause"], norn.NornError)
        self.assertEqual(getattr(seen["doomed_cause"], "kind"), "superseded")

    def test_04_payload_over_the_limit(self) -> None:
        with self.assertRaises(norn.NornError) as cm:
            self.client.enqueue("big", b"x" * ((1 << 20) + 1))
        e = cm.exception
        self.assertEqual((e.code, e.kind, e.retryable), ("invalid_argument", "payload_too_large", False))
        self.assertIn("task.payload: 1048577 exceeds the limit of 1048576", str(e))
        self.assertIn("payload limit", str(e))
        with self.assertRaises(norn.NornError) as cm:
            self.client.enqueue("big", b"x" * (5 << 20))
        e = cm.exception
        self.assertEqual((e.code, e.kind), ("resource_exhausted", "request_too_large"))
        self.assertIn("exceeds the limit of 4194304", str(e))

    def test_05_unreachable_nodes(self) -> None:
        ports = free_ports(3)  # closed again: nothing listens there
        c = norn.Client([f"127.0.0.1:{p}" for p in ports], ca=self.certs.ca, cert=self.certs.cert, key=self.certs.key)
        t0 = time.monotonic()
        with self.assertRaises(norn.NornError) as cm:
            c.enqueue("q", "x")
        e = cm.exception
        self.assertLess(time.monotonic() - t0, 5, "fails within the retries, not at the timeout")
        self.assertEqual((e.code, e.kind, e.retryable), ("unavailable", "unreachable", True))
        urls = ", ".join(f"https://127.0.0.1:{p}" for p in ports)
        self.assertIn(f"no node of [{urls}] answered: ", str(e))
        for p in ports:
            self.assertIn(f"https://127.0.0.1:{p} (connection refused)", str(e))
        with self.assertRaises(norn.NornError) as cm:
            c.claim("q", wait=1)
        self.assertEqual(cm.exception.kind, "unreachable")

    def test_06_certificates(self) -> None:
        other = Certs(os.path.join(self.dir, "other"), [], "Another CA")
        foreign = self.new_client(cert=other.cert, key=other.key)
        with self.assertRaises(norn.NornError) as cm:
            foreign.enqueue("q")
        e = cm.exception
        self.assertEqual((e.kind, e.code, e.retryable), ("certificate_rejected", "unauthenticated", False))
        self.assertRegex(str(e), r"refused the client certificate .*other/client-admin\.crt: bad certificate")
        w = norn.Worker(foreign, "q", lambda job: None, handle_signals=False)
        with self.assertRaises(norn.NornError) as cm:  # the worker stops on it rather than retrying forever
            w.run()
        self.assertEqual(cm.exception.kind, "certificate_rejected")

        wrong_ca = self.new_client(ca=other.ca)
        with self.assertRaises(norn.NornError) as cm:
            wrong_ca.get_task(1)
        e = cm.exception
        self.assertEqual((e.kind, e.retryable), ("untrusted_node", False))
        self.assertRegex(str(e), r"node https://127\.0\.0\.1:\d+ is not trusted: its certificate did not verify "
                                 r"against the CA the client was given \(unable to get local issuer certificate\)")

        expired = os.path.join(self.dir, "expired.crt")
        make_expired_cert(self.certs, expired)
        with self.assertRaises(norn.NornError) as cm:
            self.new_client(cert=expired)
        e = cm.exception
        self.assertEqual((e.kind, e.code), ("certificate_expired", "unauthenticated"))
        self.assertRegex(str(e), r"client certificate .*expired\.crt \(commonName=admin\) expired on 20\d\d-")
        # Past the client's own check, the node refuses it, and the client says why.
        with mock.patch.object(norn, "_check_client_cert"):
            late = self.new_client(cert=expired)
        with self.assertRaises(norn.NornError) as cm:
            late.enqueue("q")
        self.assertEqual(cm.exception.kind, "certificate_expired")
        self.assertRegex(str(cm.exception), r"refused the client certificate .*expired\.crt: it expired on 20\d\d-")

    def test_07_tokens(self) -> None:
        addrs = self.auth.addrs
        good = norn.Client(addrs, ca=self.certs.ca, token=self.token)
        unknown = norn.Client(addrs, ca=self.certs.ca, token="norn_00000000_0123456789abcdef0123456789abcdef")
        none = norn.Client(addrs, ca=self.certs.ca)
        for c in (good, unknown, none):
            self.addCleanup(c.close)
        self.assertGreater(good.enqueue("jobs", "x"), 0)
        with self.assertRaises(norn.NornError) as cm:
            good.enqueue("other")
        self.assertEqual(cm.exception.code, "permission_denied")
        self.assertIn("ci", cm.exception.server_message)
        with self.assertRaises(norn.NornError) as cm:
            unknown.enqueue("jobs")
        e = cm.exception
        self.assertEqual((e.code, e.retryable), ("unauthenticated", False))
        self.assertIn("does not accept the bearer token: it is unknown or revoked", str(e))
        with self.assertRaises(norn.NornError) as cm:
            none.enqueue("jobs")
        self.assertIn("needs credentials", str(cm.exception))

        nornctl("token", "revoke", self.token.split("_")[1], "--auth-file", self.auth_file)
        self.auth.nodes[0].proc.send_signal(signal.SIGHUP)  # reload the access file now
        until = time.monotonic() + 10
        while True:
            try:
                good.enqueue("jobs")
            except norn.NornError as e:
                self.assertEqual(e.code, "unauthenticated")
                self.assertIn("unknown or revoked", str(e))
                break
            self.assertLess(time.monotonic(), until, "the revoked token still works after 10 s")
            time.sleep(0.1)

    def test_08_worker_stops_on_sigterm(self) -> None:
        queue = "signal"
        id = self.client.enqueue(queue, "long")
        script = (
            "import sys, norn\n"
            "c = norn.Client(sys.argv[1], ca=sys.argv[3], cert=sys.argv[4], key=sys.argv[5])\n"
            "def handler(job):\n"
            "    print('started', job.id, flush=True)\n"
            "    job.stopped.wait(60)\n"
            "    raise RuntimeError('interrupted')\n"
            "norn.Worker(c, sys.argv[2], handler, lease=5, wait=1).run()\n"
            "print('stopped', flush=True)\n")
        p = subprocess.Popen([sys.executable, "-c", script, ",".join(self.cluster.addrs), queue, self.certs.ca,
                              self.certs.cert, self.certs.key], cwd=HERE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None
            line = p.stdout.readline()
            self.assertEqual(line.split(), ["started", str(id)], p.stderr.read() if not line else line)
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=10)
            self.assertEqual(p.returncode, 0, err)
            self.assertLess(time.monotonic() - t0, 5, "stopped within 5 s")
            self.assertIn("stopped", out)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        t = self.client.get_task(id)
        self.assertEqual(t.status, "READY", "yielded: claimable again without waiting for the lease")
        self.assertEqual(t.claims[0].end_reason, "YIELDED")
        self.client.cancel(id)

    def test_09_kill9_mid_run(self) -> None:
        """Last but one: kill -9 of the node leading a running task's
        partition while a Worker runs; every task is still completed."""
        c, queue, n = self.client, "survive", 40
        ids = c.enqueue_batch([norn.TaskSpec(queue, f"t{i}") for i in range(n)])
        handled: set[int] = set()
        running: dict[int, str] = {}
        lock = threading.Lock()

        def handler(job: norn.Job) -> bytes:
            with lock:
                running[job.id] = job.leader
            time.sleep(0.15)
            with lock:
                running.pop(job.id, None)
                handled.add(job.id)
            return b"ok:" + job.payload

        w = norn.Worker(self.new_client(), queue, handler, concurrency=4, lease=3, wait=1).start()
        try:
            wait_for(lambda: len(handled) >= 8, 15, "the worker got going")
            with lock:
                busy = set(running.values())
            victim = next((x for x in self.cluster.nodes if x.api in busy), self.cluster.nodes[1])
            self.cluster.kill9(victim)
            got = wait_terminal(c, ids, 45)
        finally:
            w.stop()
        for i, id in enumerate(ids):
            self.assertEqual((got[id].status, got[id].result), ("COMPLETED", b"ok:t%d" % i), f"task {id}")
        # The client goes on working against the survivors.
        id = c.enqueue("after-kill", "x")
        [ct] = c.claim("after-kill", lease=5, wait=2)
        c.complete(ct.task.id, ct.claim_id, "y")
        self.assertEqual(c.get_task(id).status, "COMPLETED")

    def test_10_missed_quorum_retries_with_one_id(self) -> None:
        """After the kill: a write to all 3 replicas (w=3) misses its quorum;
        the WriteFailure's id makes every retry the same task."""
        c = self.client
        if all(x.proc.poll() is None for x in self.cluster.nodes):  # run alone: no node was killed yet
            self.cluster.kill9(self.cluster.nodes[2])
        with self.assertRaises(norn.NornError) as cm:
            c.enqueue("quorum", "w3", w=3, timeout=5)
        e = cm.exception
        what = f"{e} (attempts {e.attempts}, ids {e.ids})"
        self.assertEqual(e.code, "unavailable", what)
        self.assertTrue(e.retryable)
        assert e.write_failure is not None, what
        self.assertEqual(e.write_failure.w, 3, what)
        self.assertEqual(len(e.ids), 1, what)
        self.assertEqual(e.write_failure.ids, e.ids, what)
        self.assertGreaterEqual(e.attempts, 2, what)
        id = e.ids[0]
        self.assertEqual(c.get_task(id).spec.queue, "quorum")
        self.assertEqual(c.enqueue("quorum", "w3", id=id, w=2), id)
        self.assertEqual(c.count_tasks("quorum").total, 1, "one task, however many attempts")


if __name__ == "__main__":
    unittest.main(verbosity=2)
