// The client against real nornd processes: a 3-node cluster with TLS and a
// single node with an access file, started by the test (test/cluster.ts)
// and stopped at the end, by pid, whatever happened.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import {
  ClaimEnd,
  Client,
  NornError,
  TaskStatus,
  Worker,
  loadTls,
  permanent,
  type Task,
  type TlsOptions,
} from "../src/index.js";
import { Cluster, freePorts, makeCerts, nornctl, type Certs } from "./cluster.js";

const dec = new TextDecoder();
const silent = { info: () => undefined, warn: () => undefined, error: () => undefined };
const quiet = { info: () => undefined, warn: () => undefined, error: (m: string, f?: Record<string, unknown>) => console.error(m, f ?? "") };
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

let cluster: Cluster | undefined;
let authNode: Cluster | undefined;
let certs: Certs;
let tls: TlsOptions;
let client: Client;
let dir: string;
let authFile: string;
let token: string;
const clients: Client[] = [];

/** A client of the 3-node cluster (closed at the end). */
function newClient(opts: ConstructorParameters<typeof Client>[1] = {}): Client {
  const c = new Client(cluster!.addrs(), { tls, ...opts });
  clients.push(c);
  return c;
}

/** Waits until every task is terminal (or the time is up); returns them. */
async function waitTerminal(c: Client, ids: bigint[], timeoutMs: number): Promise<Map<bigint, Task>> {
  const until = Date.now() + timeoutMs;
  const done = new Map<bigint, Task>();
  const terminal = new Set([TaskStatus.COMPLETED, TaskStatus.ABORTED, TaskStatus.CANCELLED, TaskStatus.DEAD]);
  for (;;) {
    await Promise.all(
      ids
        .filter((id) => !done.has(id))
        .map(async (id) => {
          const t = await c.getTask(id).catch(() => undefined);
          if (t && terminal.has(t.status)) done.set(id, t);
        }),
    );
    if (done.size === ids.length) return done;
    if (Date.now() > until) {
      const left = ids.filter((id) => !done.has(id));
      assert.fail(`${left.length} of ${ids.length} tasks not terminal after ${timeoutMs} ms: ${left.slice(0, 5).join(", ")}`);
    }
    await sleep(200);
  }
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "norn-ts-test-"));
  certs = await makeCerts(join(dir, "certs"), ["n1", "n2", "n3"]);
  tls = loadTls({ caFile: certs.ca, certFile: certs.clientCert, keyFile: certs.clientKey });
  // The access file of the single node: the admin certificate may do
  // everything; user "ci" (a token) may enqueue into "jobs".
  authFile = join(dir, "auth.json");
  await nornctl(["grant", "admin", "admin", "--auth-file", authFile]);
  await nornctl(["grant", "ci", "producer", "--queues", "jobs", "--auth-file", authFile]);
  token = (await nornctl(["token", "create", "ci", "--auth-file", authFile])).trim();
  assert.match(token, /^norn_[0-9a-f]+_[0-9a-f]+$/);
  [cluster, authNode] = await Promise.all([
    Cluster.start({ certs, name: "three" }),
    Cluster.start({ certs, nodes: 1, authFile, name: "auth" }),
  ]);
  client = newClient();
}, { timeout: 90_000 });

after(async () => {
  for (const c of clients) c.close();
  await Promise.all([cluster?.stop(), authNode?.stop()]);
  if (dir && !process.env.NORN_KEEP) rmSync(dir, { recursive: true, force: true });
}, { timeout: 30_000 });

describe("a 3-node cluster with TLS", { timeout: 120_000 }, () => {
  test("enqueue, claim, renew, update, complete round trip", async () => {
    const id = await client.enqueue({ queue: "roundtrip", payload: "hello", priority: 3 });
    assert.ok(id > 0n);
    const claimed = await client.claim({ queue: "roundtrip", worker: "ts-test", leaseMs: 2000, waitMs: 2000 });
    assert.equal(claimed.length, 1);
    const ct = claimed[0]!;
    assert.equal(ct.task?.id, id);
    assert.equal(dec.decode(ct.task?.spec?.payload), "hello");
    assert.ok(cluster!.addrs().includes(ct.leader), `leader ${ct.leader} is one of the nodes`);

    const first = await client.renew(id, ct.claimId, 5000);
    assert.ok(first.getTime() > Date.now() + 3000, `renewed to ${first.toISOString()}`);
    await client.update(id, ct.claimId, 1n, 0.5, "half way");
    await client.complete(id, ct.claimId, "done");

    const t = await client.getTask(id);
    assert.equal(t.status, TaskStatus.COMPLETED);
    assert.equal(dec.decode(t.result), "done");
    assert.equal(t.claims.length, 1);
    assert.equal(t.claims[0]!.worker, "ts-test");
    assert.equal(t.claims[0]!.endReason, ClaimEnd.COMPLETED);
    assert.equal(t.updates[0]?.message, "half way");

    // The claim has ended: a renew is refused, and says so.
    await assert.rejects(client.renew(id, ct.claimId, 1000), (e: unknown) => e instanceof NornError && e.kind === "superseded");
    // An idempotent retry of the enqueue with the id it got changes nothing.
    assert.equal(await client.enqueue({ queue: "roundtrip", payload: "hello", priority: 3 }, { id }), id);
    // The same id with another spec is refused.
    await assert.rejects(client.enqueue({ queue: "roundtrip", payload: "other" }, { id }), (e: unknown) => e instanceof NornError && e.kind === "already_exists");
  });

  test("HTTP/1.1 (Connect's protocol over https with the client certificate)", async () => {
    const h1 = newClient({ httpVersion: "1.1" });
    const id = await h1.enqueue({ queue: "h1", payload: "over http/1.1" });
    const t = await h1.getTask(id);
    assert.equal(dec.decode(t.spec?.payload), "over http/1.1");
    const [ct] = await h1.claim({ queue: "h1", waitMs: 1000 });
    assert.equal(ct?.task?.id, id);
    await h1.complete(id, ct!.claimId, "ok");
    assert.equal((await h1.getTask(id)).status, TaskStatus.COMPLETED);
  });

  test("a Worker: plain tasks, a handler that throws, one that runs past its lease", async () => {
    const queue = "work";
    const lease = 1200;
    const plain = await client.enqueueBatch(Array.from({ length: 10 }, (_, i) => ({ queue, payload: `plain-${i}` })));
    const bad = await client.enqueue({ queue, payload: "permanent" });
    const flaky = await client.enqueue({
      queue,
      payload: "flaky",
      retry: { maxAttempts: 3, initialBackoff: { seconds: 0n, nanos: 100_000_000 } },
    });
    const slow = await client.enqueue({ queue, payload: "slow" });
    let flakyRuns = 0;
    let slowAborted = false;
    const worker = new Worker(newClient(), {
      queue,
      concurrency: 4,
      leaseMs: lease,
      waitMs: 1000,
      handleSignals: false,
      logger: quiet,
      handler: async (task) => {
        const p = task.text();
        if (p === "permanent") throw permanent(new Error("cannot parse the payload: bad JSON at byte 3"));
        if (p === "flaky" && ++flakyRuns === 1) throw new Error("flaky: disk full on /var/tmp");
        if (p === "slow") {
          await sleep(lease * 2.5); // past its lease: the worker must renew
          slowAborted = task.signal.aborted;
        }
        return `done:${p}`;
      },
    });
    const running = worker.run();
    try {
      const all = await waitTerminal(client, [...plain, bad, flaky, slow], 20_000);
      for (const [i, id] of plain.entries()) {
        const t = all.get(id)!;
        assert.equal(t.status, TaskStatus.COMPLETED);
        assert.equal(dec.decode(t.result), `done:plain-${i}`);
      }

      const b = all.get(bad)!;
      assert.equal(b.status, TaskStatus.ABORTED, "a permanent error aborts for good");
      assert.equal(b.errors[0]?.code, "handler_error");
      assert.equal(b.errors[0]?.description, "cannot parse the payload: bad JSON at byte 3");

      const f = all.get(flaky)!;
      assert.equal(f.status, TaskStatus.COMPLETED, "a thrown error fails the attempt; the retry completes");
      assert.equal(f.claims.length, 2);
      assert.equal(f.claims[0]!.endReason, ClaimEnd.FAILED);
      const attempt = f.errors.find((e) => e.attempt === 1);
      assert.equal(attempt?.code, "handler_error");
      assert.equal(attempt?.description, "flaky: disk full on /var/tmp");

      const s = all.get(slow)!;
      assert.equal(s.status, TaskStatus.COMPLETED);
      assert.equal(dec.decode(s.result), "done:slow");
      assert.equal(slowAborted, false, "the slow handler was not stopped");
      assert.equal(s.claims.length, 1, "one claim: it never expired");
      const c = s.claims[0]!;
      const held = Number(c.expiry!.seconds - c.start!.seconds);
      assert.ok(held >= 2, `the lease was renewed (claim from ${c.start?.seconds} to ${c.expiry?.seconds})`);
    } finally {
      await worker.stop();
    }
    await running;
  });

  test("errors: payload and request over the limit", async () => {
    await assert.rejects(client.enqueue({ queue: "big", payload: new Uint8Array((1 << 20) + 1) }), (e: unknown) => {
      assert.ok(e instanceof NornError);
      assert.equal(e.kind, "payload_too_large");
      assert.match(e.message, /task\.payload: 1048577 exceeds the limit of 1048576/);
      assert.match(e.message, /over the node's limit/);
      return true;
    });
    await assert.rejects(client.enqueue({ queue: "big", payload: new Uint8Array(5 << 20) }), (e: unknown) => {
      assert.ok(e instanceof NornError);
      assert.equal(e.kind, "request_too_large");
      assert.match(e.message, /request size limit/);
      return true;
    });
  });

  test("errors: a client certificate from another CA, a node the client's CA does not sign", async () => {
    const other = await makeCerts(join(dir, "other"), [], "Another CA");
    const foreign = newClient({ tls: loadTls({ caFile: certs.ca, certFile: other.clientCert, keyFile: other.clientKey }) });
    await assert.rejects(foreign.enqueue({ queue: "q" }), (e: unknown) => {
      assert.ok(e instanceof NornError);
      assert.equal(e.kind, "certificate_rejected");
      assert.match(e.message, /refused the client certificate .*other\/client-admin\.crt: bad certificate: it is not issued by the cluster's CA/);
      return true;
    });
    // A Worker stops on it rather than retrying forever.
    const w = new Worker(foreign, { queue: "q", handler: () => undefined, handleSignals: false, logger: silent });
    await assert.rejects(w.run(), (e: unknown) => e instanceof NornError && e.kind === "certificate_rejected");

    const wrongCA = newClient({ tls: loadTls({ caFile: other.ca, certFile: certs.clientCert, keyFile: certs.clientKey }) });
    await assert.rejects(wrongCA.enqueue({ queue: "q" }), (e: unknown) => {
      assert.ok(e instanceof NornError);
      assert.equal(e.kind, "untrusted_node");
      assert.match(e.message, /is not trusted: its certificate is not signed by the CA the client was given/);
      return true;
    });
  });

  test("errors: an expired client certificate is named before any call", async (t) => {
    // nornctl makes certificates valid for a year; openssl makes one of the
    // cluster's CA that expires at once (-days 0).
    try {
      execFileSync("openssl", ["version"], { stdio: "ignore" });
    } catch {
      t.skip("openssl is not installed: cannot make an expired certificate");
      return;
    }
    const d = join(dir, "expired");
    mkdirSync(d, { recursive: true });
    const key = join(d, "old.key");
    const csr = join(d, "old.csr");
    const crt = join(d, "old.crt");
    execFileSync("openssl", ["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key], { stdio: "ignore" });
    execFileSync("openssl", ["req", "-new", "-key", key, "-subj", "/CN=old-client", "-out", csr], { stdio: "ignore" });
    execFileSync("openssl", ["x509", "-req", "-in", csr, "-CA", certs.ca, "-CAkey", certs.caKey, "-CAcreateserial", "-days", "0", "-out", crt], { stdio: "ignore" });
    await sleep(1100); // valid for no time at all: expired a second later
    assert.throws(
      () => new Client(cluster!.addrs(), { tls: loadTls({ caFile: certs.ca, certFile: crt, keyFile: key }) }),
      (e: unknown) => {
        assert.ok(e instanceof NornError);
        assert.equal(e.kind, "certificate_expired");
        assert.match(e.message, /client certificate .*old\.crt \(CN=old-client\) expired on 20\d\d-/);
        return true;
      },
    );
  });

  test("errors: no node reachable", async () => {
    const ports = await freePorts(3); // closed again: nothing listens there
    const c = new Client(ports.map((p) => `127.0.0.1:${p}`), { tls, discoveryIntervalMs: 0 });
    clients.push(c);
    const t0 = Date.now();
    await assert.rejects(c.enqueue({ queue: "q" }), (e: unknown) => {
      assert.ok(e instanceof NornError);
      assert.equal(e.kind, "unreachable");
      for (const p of ports) assert.match(e.message, new RegExp(`https://127\\.0\\.0\\.1:${p} \\(connection refused\\)`));
      return true;
    });
    assert.ok(Date.now() - t0 < 5000, "fails within the retries, not at the timeout");
    await assert.rejects(c.claim({ queue: "q", waitMs: 1000 }), (e: unknown) => e instanceof NornError && e.kind === "unreachable");
  });

  test("errors: an unknown token, a revoked token, a queue outside the grants (a node with an access file)", async () => {
    const node = authNode!;
    const ca = { ca: tls.ca }; // no client certificate: the token is the credential
    const good = new Client(node.addrs(), { tls: ca, token, discoveryIntervalMs: 0 });
    const unknown = new Client(node.addrs(), { tls: ca, token: "norn_00000000_0123456789abcdef0123456789abcdef", discoveryIntervalMs: 0 });
    const none = new Client(node.addrs(), { tls: ca, discoveryIntervalMs: 0 });
    clients.push(good, unknown, none);

    assert.ok((await good.enqueue({ queue: "jobs", payload: "x" })) > 0n);
    await assert.rejects(good.enqueue({ queue: "other" }), (e: unknown) => e instanceof NornError && e.kind === "permission_denied" && /ci/.test(e.message));
    await assert.rejects(unknown.enqueue({ queue: "jobs" }), (e: unknown) => {
      assert.ok(e instanceof NornError);
      assert.equal(e.kind, "unauthenticated");
      assert.match(e.message, /bearer token: it is unknown or revoked/);
      return true;
    });
    await assert.rejects(none.enqueue({ queue: "jobs" }), (e: unknown) => e instanceof NornError && e.kind === "unauthenticated" && /needs credentials/.test(e.message));

    const id = token.split("_")[1]!;
    await nornctl(["token", "revoke", id, "--auth-file", authFile]);
    node.signal("n1", "SIGHUP"); // reload the access file now
    const until = Date.now() + 10_000;
    for (;;) {
      const err = await good.enqueue({ queue: "jobs" }).then(() => undefined, (e: unknown) => e);
      if (err !== undefined) {
        assert.ok(err instanceof NornError);
        assert.equal(err.kind, "unauthenticated");
        assert.match(err.message, /bearer token: it is unknown or revoked/);
        break;
      }
      assert.ok(Date.now() < until, "the revoked token still works after 10 s");
      await sleep(100);
    }
  });

  test("a Worker process stops cleanly on SIGTERM: the held task is yielded back at once", async () => {
    const queue = "signal";
    const id = await client.enqueue({ queue, payload: "long" });
    const script = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "sigterm-worker.js");
    const child = spawn(process.execPath, [script, cluster!.addrs().join(","), queue], {
      env: { ...process.env, NORN_CA: certs.ca, NORN_CERT: certs.clientCert, NORN_KEY: certs.clientKey },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    child.stdout.on("data", (b: Buffer) => (out += b.toString()));
    child.stderr.on("data", (b: Buffer) => (err += b.toString()));
    const exited = new Promise<number | null>((ok) => child.once("exit", (code) => ok(code)));
    try {
      const until = Date.now() + 15_000;
      while (!out.includes(`started ${id}`)) {
        assert.ok(Date.now() < until, `the worker did not start the task: ${out} ${err}`);
        assert.equal(child.exitCode, null, `the worker exited: ${out} ${err}`);
        await sleep(50);
      }
      const t0 = Date.now();
      child.kill("SIGTERM");
      const code = await exited;
      assert.equal(code, 0, `exit code; stderr: ${err}`);
      assert.ok(Date.now() - t0 < 5000, "stopped within 5 s");
      assert.match(out, /stopped/);
      const t = await client.getTask(id);
      assert.equal(t.status, TaskStatus.READY, "yielded: claimable again, without waiting for the lease");
      assert.equal(t.claims[0]?.endReason, ClaimEnd.YIELDED);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    }
    await client.cancel(id);
  });

  // Last: it kills a node of the cluster.
  test("kill -9 of a node while a Worker runs: every task is still completed", async () => {
    const queue = "survive";
    const n = 40;
    const ids = await client.enqueueBatch(Array.from({ length: n }, (_, i) => ({ queue, payload: `t${i}` })));
    const handled = new Set<string>();
    const leaders = new Map<string, string>(); // running task -> its partition's leader
    let runs = 0;
    const worker = new Worker(newClient(), {
      queue,
      concurrency: 4,
      leaseMs: 3000,
      waitMs: 1000,
      handleSignals: false,
      logger: process.env.NORN_DEBUG ? console : quiet,
      handler: async (task) => {
        runs++;
        leaders.set(task.id.toString(), task.leader);
        await sleep(150);
        leaders.delete(task.id.toString());
        handled.add(task.id.toString());
        return `ok:${task.text()}`;
      },
    });
    const running = worker.run();
    try {
      const until = Date.now() + 15_000;
      while (handled.size < 8) {
        assert.ok(Date.now() < until, "the worker did not get going");
        await sleep(20);
      }
      // Kill the node that leads the partition of a task being handled,
      // so that its renew and complete must outlast a leader's failover.
      const busy = [...leaders.values()];
      const victim = cluster!.nodes.find((nd) => busy.includes(nd.api)) ?? cluster!.nodes[1]!;
      await cluster!.kill9(victim.id);
      const all = await waitTerminal(client, ids, 45_000);
      for (const [i, id] of ids.entries()) {
        const t = all.get(id)!;
        assert.equal(t.status, TaskStatus.COMPLETED, `task ${id}`);
        assert.equal(dec.decode(t.result), `ok:t${i}`);
      }
      assert.ok(runs >= n);
    } finally {
      await worker.stop();
    }
    await running;
  });

  // After the kill: a node is down, so a write to all 3 replicas (w=3)
  // misses its quorum.
  test("a missed write quorum: the WriteFailure's id makes the retries idempotent", async () => {
    const spec = { queue: "quorum", payload: "w3" };
    const err = await client.enqueue(spec, { w: 3, timeoutMs: 5000 }).then(
      () => assert.fail("w=3 with a node down succeeded"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof NornError, String(err));
    const what = `${err.message} (attempts ${err.attempts}, ids ${err.ids})`;
    assert.equal(err.kind, "unavailable", what);
    assert.ok(err.writeFailure, `a WriteFailure detail: ${what}`);
    assert.equal(err.writeFailure.w, 3, what);
    assert.equal(err.ids.length, 1, `the id to retry with: ${what}`);
    const id = err.ids[0]!;
    assert.deepEqual(err.writeFailure.ids, [id], `every retry used the same id: ${what}`);
    assert.ok(err.attempts >= 2 || /gave up retrying/.test(err.message), `retried: ${what}`);
    // Stored on the live replicas, once; a retry at w=2 with the id succeeds.
    assert.equal((await client.getTask(id)).spec?.queue, "quorum");
    assert.equal(await client.enqueue(spec, { id, w: 2 }), id);
    const counts = await client.countTasks("quorum");
    assert.equal(counts.total, 1n, `one task, however many attempts: ${JSON.stringify(counts.byStatus, (_, v) => (typeof v === "bigint" ? String(v) : v))}`);
  });
});
