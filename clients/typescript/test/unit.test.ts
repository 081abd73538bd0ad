// Unit tests of the client's pure parts: addresses, backoff, endpoint
// health, the classification of failures, and the Worker's abort errors.

import { describe, test } from "node:test";
import assert from "node:assert/strict";

import {
  Code,
  ConnectError,
  Endpoints,
  NornError,
  TaskFailure,
  abortError,
  backoffMs,
  endpointBackoffMs,
  isPermanent,
  parseSeeds,
  permanent,
  type Endpoint,
} from "../src/index.js";
import { overBudget, toNornError, transportFailure } from "../src/errors.js";

function sysErr(code: string, message = code): Error {
  return Object.assign(new Error(message), { code });
}

describe("addresses", () => {
  test("a list, with and without schemes", () => {
    assert.deepEqual(parseSeeds("127.0.0.1:7400, 127.0.0.1:7410,127.0.0.1:7400", "https"), {
      bases: ["https://127.0.0.1:7400", "https://127.0.0.1:7410"],
      scheme: "https",
    });
    assert.deepEqual(parseSeeds(["http://a:1", "b:2"], "http").bases, ["http://a:1", "http://b:2"]);
  });
  test("bad lists are refused, naming the address", () => {
    assert.throws(() => parseSeeds("", "http"), /no node address/);
    assert.throws(() => parseSeeds("http://a:1,https://b:2", "http"), /mixes http and https/);
    assert.throws(() => parseSeeds("ftp://a:1", "http"), /scheme must be http or https/);
    assert.throws(() => parseSeeds("a:1/path", "http"), /want host:port/);
    assert.throws(() => parseSeeds("a:1,", "http"), (e: unknown) => e instanceof NornError && e.kind === "bad_config");
  });
});

describe("backoff", () => {
  const p = { maxAttempts: 5, baseBackoffMs: 50, maxBackoffMs: 2000 };
  test("doubles from the base, within [d/2, d), capped", () => {
    for (let k = 1; k <= 10; k++) {
      const d = Math.min(50 * 2 ** (k - 1), 2000);
      for (let i = 0; i < 50; i++) {
        const w = backoffMs(p, k);
        assert.ok(w >= d / 2 && w < d, `attempt ${k}: ${w} not in [${d / 2}, ${d})`);
      }
    }
  });
  test("a failing node is skipped for 1 s, doubling to 30 s", () => {
    assert.deepEqual([1, 2, 3, 5, 6, 7, 20].map(endpointBackoffMs), [1000, 2000, 4000, 16000, 30000, 30000, 30000]);
  });
});

describe("endpoints", () => {
  const make = (base: string): Endpoint => ({
    base,
    tasks: {} as Endpoint["tasks"],
    admin: {} as Endpoint["admin"],
    queues: {} as Endpoint["queues"],
    close: () => undefined,
    failures: 0,
    downUntil: 0,
    failedAt: 0,
  });
  test("round robin, skipping a failed node, avoiding the last attempt's", () => {
    const e = new Endpoints(["a", "b", "c"], make);
    assert.deepEqual([0, 0, 0, 0].map(() => e.pick(0).base), ["a", "b", "c", "a"]);
    const b = e.all()[1]!;
    assert.equal(e.failed(b, 100), true);
    assert.equal(e.failed(b, 150), false, "failures while down count once");
    const picks = Array.from({ length: 6 }, () => e.pick(200).base);
    assert.ok(!picks.includes("b"), `b skipped: ${picks}`);
    const back = new Set([0, 1, 2].map(() => e.pick(1100).base));
    assert.ok(back.has("b"), "b is picked again after its 1 s");
    const a = e.all()[0]!;
    assert.notEqual(e.pick(2000, a).base, "a");
  });
  test("when every node is down, the one that failed longest ago", () => {
    const e = new Endpoints(["a", "b"], make);
    e.failed(e.all()[1]!, 10);
    e.failed(e.all()[0]!, 20);
    assert.equal(e.pick(30).base, "b");
  });
  test("learned nodes are added after the seeds; known ones keep their health", () => {
    const e = new Endpoints(["a"], make);
    e.failed(e.all()[0]!, 0);
    e.set(["c", "a", "b"]);
    assert.deepEqual(e.all().map((x) => x.base), ["a", "b", "c"]);
    assert.equal(e.all()[0]!.failures, 1);
  });
});

describe("failures", () => {
  test("transport failures: what they mean for retries", () => {
    const refused = new ConnectError("x", Code.Unavailable, undefined, undefined, sysErr("ECONNREFUSED"));
    assert.deepEqual(transportFailure(refused), { kind: "unreachable", reason: "connection refused", neverSent: true, nodeDown: true });
    const reset = new ConnectError("x", Code.Aborted, undefined, undefined, sysErr("ECONNRESET"));
    assert.equal(transportFailure(reset)?.neverSent, false);
    const h2cancel = new ConnectError("http/2 stream closed with error code CANCEL (0x8)", Code.Canceled);
    assert.equal(transportFailure(h2cancel)?.kind, "unreachable");
    const alert = new ConnectError("x", Code.Internal, undefined, undefined, sysErr("ERR_SSL_TLSV1_ALERT_UNKNOWN_CA"));
    assert.equal(transportFailure(alert)?.kind, "certificate_rejected");
    const expired = new ConnectError("x", Code.Internal, undefined, undefined, sysErr("ERR_SSL_SSLV3_ALERT_CERTIFICATE_EXPIRED"));
    assert.equal(transportFailure(expired)?.kind, "certificate_expired");
    const untrusted = new ConnectError("x", Code.Internal, undefined, undefined, sysErr("UNABLE_TO_VERIFY_LEAF_SIGNATURE"));
    assert.equal(transportFailure(untrusted)?.kind, "untrusted_node");
    const cleartext = new ConnectError("x", Code.Internal, undefined, undefined, sysErr("ERR_SSL_WRONG_VERSION_NUMBER"));
    assert.match(transportFailure(cleartext)?.reason ?? "", /does not speak TLS/);
    assert.equal(transportFailure(new ConnectError("no", Code.Unavailable)), undefined, "an answer of the node");
  });
  test("answers of the node keep their code and name what is wrong", () => {
    const big = toNornError(new ConnectError("task.payload: 1048577 exceeds the limit of 1048576", Code.InvalidArgument), "enqueue", "https://n:1");
    assert.equal(big.kind, "payload_too_large");
    assert.equal(big.code, Code.InvalidArgument);
    assert.match(big.message, /^norn: enqueue: \[INVALID_ARGUMENT\] a payload, result or data over the node's limit .*task\.payload: 1048577 exceeds/);
    const tok = toNornError(new ConnectError("unknown token", Code.Unauthenticated), "claim", undefined, { usedToken: true });
    assert.equal(tok.kind, "unauthenticated");
    assert.match(tok.message, /unknown or revoked/);
    const busy = toNornError(new ConnectError("client requests over budget, retry later", Code.ResourceExhausted), "claim", undefined);
    assert.equal(busy.kind, "resource_exhausted");
    const told = new ConnectError("the node is busy", Code.ResourceExhausted);
    told.details.push({ type: "google.rpc.RetryInfo", value: new Uint8Array() });
    assert.equal(overBudget(told), true, "a RetryInfo detail says the call did not run");
    assert.equal(overBudget(new ConnectError("request of 99 bytes exceeds the limit of 9", Code.ResourceExhausted)), false);
    const gone = toNornError(new ConnectError("claim 4 expired", Code.FailedPrecondition), "renew", undefined);
    assert.equal(gone.kind, "superseded");
  });
});

describe("handler errors", () => {
  test("the abort's error: a TaskFailure's fields, else handler_error and the text", () => {
    assert.deepEqual(abortError(new Error("disk full")), { code: "handler_error", description: "disk full", args: [] });
    assert.deepEqual(abortError(permanent(new TaskFailure("bad_payload", "not JSON", ["3"]))), { code: "bad_payload", description: "not JSON", args: ["3"] });
    assert.deepEqual(abortError("plain string"), { code: "handler_error", description: "plain string", args: [] });
    assert.equal(abortError(new Error("x".repeat(100_000))).description.length, 16 << 10);
  });
  test("permanent errors are found through causes", () => {
    assert.equal(isPermanent(permanent(new Error("x"))), true);
    assert.equal(isPermanent(new Error("outer", { cause: permanent("inner") })), true);
    assert.equal(isPermanent(new Error("x")), false);
  });
});
