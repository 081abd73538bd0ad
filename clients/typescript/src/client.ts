// The Norn client: calls spread over several nodes with fail-over, retried
// by docs/API.md's rules, over TLS with a client certificate or a bearer
// token. It mirrors the Go client's hand-written layer (client/ in the
// repository): endpoints.go, retry.go, hints.go, discovery.go.

import { readFileSync } from "node:fs";
import { X509Certificate, createPrivateKey } from "node:crypto";
import * as https from "node:https";
import * as http from "node:http";
import { hostname } from "node:os";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate, type Duration } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client as ConnectClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { TaskService } from "./gen/norn/v1/task_service_pb.js";
import type { CountTasksResponse, ListTasksRequestSchema, ListTasksResponse } from "./gen/norn/v1/task_service_pb.js";
import {
  ClaimRequestSchema,
  EnqueueRequestSchema,
  EnqueueBatchRequestSchema,
  UpdateRequestSchema,
} from "./gen/norn/v1/task_service_pb.js";
import { AdminService, type StatusResponse } from "./gen/norn/v1/admin_service_pb.js";
import { QueueService } from "./gen/norn/v1/queue_service_pb.js";
import type { ClaimedTask, Task, TaskErrorSchema, TaskSpecSchema } from "./gen/norn/v1/task_pb.js";
import {
  NornError,
  overBudget,
  toNornError,
  transportFailure,
  writeFailureOf,
} from "./errors.js";

/** TLS material, PEM-encoded (file contents, not paths: see loadTls). */
export interface TlsOptions {
  /** The cluster's CA bundle: verifies the nodes (nornd -tls-ca). */
  ca: string | Buffer;
  /** The client certificate (nornctl cert create-client), with key. */
  cert?: string | Buffer;
  /** The client certificate's private key. */
  key?: string | Buffer;
  /** Where cert was read from, for messages (set by loadTls). */
  certFile?: string;
}

/** How calls are retried: see the README, "Retries". */
export interface ClientRetryPolicy {
  /** Attempts in all, the first included. Default 5; 1 turns retries off. */
  maxAttempts?: number;
  /** Wait after the first failed attempt, before jitter. Default 50 ms. */
  baseBackoffMs?: number;
  /** Cap of the wait between two attempts. Default 2 s. */
  maxBackoffMs?: number;
}

/** Options of a Client. */
export interface ClientOptions {
  /** TLS: the nodes' CA and, optionally, a client certificate and key. */
  tls?: TlsOptions;
  /**
   * A bearer token (nornctl token create), sent as `Authorization: Bearer
   * <token>` with every call: how a client without a client certificate
   * authenticates to nodes with an access file. Use it over TLS.
   */
  token?: string;
  /** Timeout of a call, retries included (a claim: plus its wait). Default 10 s; 0: none. */
  timeoutMs?: number;
  retry?: ClientRetryPolicy;
  /** Write quorum of writes that name none (0: the server's default, a majority). */
  w?: number;
  /**
   * How often to ask a node for the cluster's nodes (AdminService.Status)
   * and send to them too. Default 30 s; 0 turns discovery off (calls go
   * to the given addresses only).
   */
  discoveryIntervalMs?: number;
  /** "2" (the default: HTTP/2, over TLS or cleartext h2c) or "1.1". */
  httpVersion?: "2" | "1.1";
  /** More connect interceptors, run after the client's own. */
  interceptors?: Interceptor[];
}

/** Options of one call. */
export interface CallOptions {
  /** Abort the call (and its retries). */
  signal?: AbortSignal;
  /** Timeout of the call, retries included; default the client's. */
  timeoutMs?: number;
}

/** A task spec as enqueue takes it: a payload may be a string (UTF-8). */
export type TaskSpecInit = Omit<MessageInitShape<typeof TaskSpecSchema>, "payload" | "$typeName"> & { payload?: Uint8Array | string };

/** Options of enqueue and enqueueBatch. */
export interface EnqueueOptions extends CallOptions {
  /**
   * The task's id, chosen by the caller: the enqueue is then idempotent and
   * retried on any UNAVAILABLE. For enqueueBatch, ids: one per task.
   */
  id?: bigint;
  /** Write quorum (0: the client's default). */
  w?: number;
}

/** What enqueue answered. */
export interface EnqueueResult {
  id: bigint;
  /** Replicas that stored the task durably before the answer. */
  acks: number;
  /** The task's unique key was held: id is the holder's, nothing was created. */
  duplicate: boolean;
}

/** A claim's request. */
export interface ClaimOptions extends CallOptions {
  queue: string;
  /** The worker's name in the claim history. */
  worker?: string;
  /** Lease length (0: the server's default, 30 s). */
  leaseMs?: number;
  /** Most tasks to claim (0: 1; at most 1,000). */
  max?: number;
  /** Long poll: how long to wait for a task when there is none. */
  waitMs?: number;
}

/** A TaskError as abort takes it. */
export type TaskErrorInit = MessageInitShape<typeof TaskErrorSchema>;

export const DEFAULT_TIMEOUT_MS = 10_000;
export const DEFAULT_DISCOVERY_INTERVAL_MS = 30_000;
const MIN_ENDPOINT_BACKOFF_MS = 1_000;
const MAX_ENDPOINT_BACKOFF_MS = 30_000;
const MAX_STATUS_TIMEOUT_MS = 5_000;
const MAX_HINTS = 100_000;

/** Reads TLS material from PEM files (nornctl cert ...; NORN_CA, NORN_CERT, NORN_KEY). */
export function loadTls(files: { caFile: string; certFile?: string; keyFile?: string }): TlsOptions {
  const read = (what: string, f: string): Buffer => {
    try {
      return readFileSync(f);
    } catch (e) {
      throw new NornError(`norn: ${what} ${f}: ${(e as Error).message}`, { kind: "bad_config", code: Code.InvalidArgument, cause: e });
    }
  };
  const tls: TlsOptions = { ca: read("CA bundle", files.caFile) };
  if (files.certFile || files.keyFile) {
    if (!files.certFile || !files.keyFile) {
      throw new NornError("norn: a client certificate needs both certFile and keyFile", { kind: "bad_config", code: Code.InvalidArgument });
    }
    tls.cert = read("client certificate", files.certFile);
    tls.key = read("client key", files.keyFile);
    tls.certFile = files.certFile;
  }
  return tls;
}

/**
 * TLS from the environment nornctl reads (NORN_CA, NORN_CERT, NORN_KEY;
 * `. data/certs/env` after `make cluster`), or undefined when NORN_CA is
 * not set.
 */
export function tlsFromEnv(env: NodeJS.ProcessEnv = process.env): TlsOptions | undefined {
  if (!env.NORN_CA) return undefined;
  const files: { caFile: string; certFile?: string; keyFile?: string } = { caFile: env.NORN_CA };
  if (env.NORN_CERT) files.certFile = env.NORN_CERT;
  if (env.NORN_KEY) files.keyFile = env.NORN_KEY;
  return loadTls(files);
}

/**
 * Checks TLS material before any connection: the CA parses, the client
 * certificate is valid now (an expired one is named with its date) and
 * matches its key.
 */
function checkTls(tls: TlsOptions, now: number): void {
  const bad = (msg: string, kind: "bad_config" | "certificate_expired" = "bad_config", cause?: unknown): NornError =>
    new NornError(`norn: ${msg}`, { kind, code: Code.InvalidArgument, cause });
  try {
    new X509Certificate(tls.ca);
  } catch (e) {
    throw bad(`tls.ca: not a PEM certificate (${(e as Error).message})`, "bad_config", e);
  }
  if ((tls.cert === undefined) !== (tls.key === undefined)) {
    throw bad("tls: a client certificate needs both cert and key");
  }
  if (tls.cert === undefined || tls.key === undefined) return;
  const name = tls.certFile ? `client certificate ${tls.certFile}` : "client certificate";
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(tls.cert);
  } catch (e) {
    throw bad(`${name}: not a PEM certificate (${(e as Error).message})`, "bad_config", e);
  }
  const subject = cert.subject.replace(/\n/g, ", ");
  if (Date.parse(cert.validTo) <= now) {
    throw bad(`${name} (${subject}) expired on ${new Date(cert.validTo).toISOString()}: make a new one (nornctl cert create-client)`, "certificate_expired");
  }
  if (Date.parse(cert.validFrom) > now) {
    throw bad(`${name} (${subject}) is not valid before ${new Date(cert.validFrom).toISOString()} (check the clocks)`, "certificate_expired");
  }
  let matches = false;
  try {
    matches = cert.checkPrivateKey(createPrivateKey(tls.key));
  } catch (e) {
    throw bad(`${name}: the key does not parse (${(e as Error).message})`, "bad_config", e);
  }
  if (!matches) throw bad(`${name} (${subject}): the key is not the certificate's`);
}

/** Parses one address into its base URL and scheme. */
export function parseAddr(addr: string, defaultScheme: "http" | "https"): { base: string; scheme: "http" | "https" } {
  const a = addr.trim();
  if (a === "") throw new NornError("norn: empty address", { kind: "bad_config", code: Code.InvalidArgument });
  let u: URL;
  try {
    u = new URL(a.includes("://") ? a : `${defaultScheme}://${a}`);
  } catch {
    throw new NornError(`norn: address "${addr}": want host:port or https://host:port`, { kind: "bad_config", code: Code.InvalidArgument });
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") {
    throw new NornError(`norn: address "${addr}": scheme must be http or https`, { kind: "bad_config", code: Code.InvalidArgument });
  }
  if (u.host === "" || u.search !== "" || u.hash !== "" || u.username !== "" || (u.pathname !== "/" && u.pathname !== "")) {
    throw new NornError(`norn: address "${addr}": want host:port or https://host:port`, { kind: "bad_config", code: Code.InvalidArgument });
  }
  const scheme = u.protocol === "https:" ? "https" : "http";
  return { base: `${scheme}://${u.host}`, scheme };
}

/** Parses a list of addresses (an array, or one string with commas). */
export function parseSeeds(addrs: string | string[], defaultScheme: "http" | "https"): { bases: string[]; scheme: "http" | "https" } {
  const list = typeof addrs === "string" ? addrs.split(",") : addrs;
  if (list.length === 0 || list.every((a) => a.trim() === "")) {
    throw new NornError("norn: no node address given", { kind: "bad_config", code: Code.InvalidArgument });
  }
  const bases: string[] = [];
  let scheme: "http" | "https" | undefined;
  for (const a of list) {
    const p = parseAddr(a, defaultScheme);
    if (scheme !== undefined && p.scheme !== scheme) {
      throw new NornError(`norn: address list ${JSON.stringify(list)}: mixes http and https`, { kind: "bad_config", code: Code.InvalidArgument });
    }
    scheme = p.scheme;
    if (!bases.includes(p.base)) bases.push(p.base);
  }
  return { bases, scheme: scheme! };
}

/** The wait after failed attempt k (from 1): random in [d/2, d). */
export function backoffMs(p: Required<ClientRetryPolicy>, k: number): number {
  let d = p.baseBackoffMs;
  for (let i = 1; i < k && d < p.maxBackoffMs; i++) d *= 2;
  d = Math.min(d, p.maxBackoffMs);
  if (d <= 1) return d;
  return d / 2 + Math.random() * (d / 2);
}

/** How long an endpoint is skipped after its n-th failure in a row. */
export function endpointBackoffMs(n: number): number {
  let d = MIN_ENDPOINT_BACKOFF_MS;
  for (let i = 1; i < n && d < MAX_ENDPOINT_BACKOFF_MS; i++) d *= 2;
  return Math.min(d, MAX_ENDPOINT_BACKOFF_MS);
}

/** One node's API: its base URL, connect clients and health. */
export interface Endpoint {
  readonly base: string;
  readonly tasks: ConnectClient<typeof TaskService>;
  readonly admin: ConnectClient<typeof AdminService>;
  readonly queues: ConnectClient<typeof QueueService>;
  close(): void;
  failures: number;
  downUntil: number;
  failedAt: number;
}

/**
 * The nodes calls go to, with their health: a node that fails (its
 * connection, or an UNAVAILABLE without a WriteFailure) is skipped for 1 s,
 * doubling with each failure in a row up to 30 s; any answer ends it.
 */
export class Endpoints {
  private list: Endpoint[];
  private next = 0;
  constructor(
    private readonly seeds: string[],
    private readonly make: (base: string) => Endpoint,
  ) {
    this.list = seeds.map(make);
  }

  /**
   * The endpoint for an attempt: the next healthy one in turn other than
   * avoid; avoid when it is the only healthy one; when none is healthy, the
   * one that failed longest ago.
   */
  pick(now: number, avoid?: Endpoint): Endpoint {
    const n = this.list.length;
    let fallback: Endpoint | undefined;
    let avoidHealthy = false;
    for (let i = 0; i < n; i++) {
      const j = (this.next + i) % n;
      const ep = this.list[j]!;
      if (now < ep.downUntil) {
        if (fallback === undefined || ep.failedAt < fallback.failedAt) fallback = ep;
      } else if (ep === avoid) {
        avoidHealthy = true;
      } else {
        this.next = (j + 1) % n;
        return ep;
      }
    }
    if (avoidHealthy && avoid) return avoid;
    return fallback ?? this.list[0]!;
  }

  /** The endpoint of base when it is healthy. */
  preferred(now: number, base: string): Endpoint | undefined {
    return this.list.find((ep) => ep.base === base && now >= ep.downUntil);
  }

  /** Records a failure that shows ep down; true when it went down now. */
  failed(ep: Endpoint, now: number): boolean {
    ep.failedAt = now;
    if (now < ep.downUntil) return false;
    ep.failures++;
    ep.downUntil = now + endpointBackoffMs(ep.failures);
    return true;
  }

  succeeded(ep: Endpoint): void {
    ep.failures = 0;
    ep.downUntil = 0;
  }

  /** Makes the set the seeds plus learned; known endpoints keep their state. */
  set(learned: string[]): void {
    const old = new Map(this.list.map((ep) => [ep.base, ep]));
    const list: Endpoint[] = [];
    const seen = new Set<string>();
    for (const b of [...this.seeds, ...[...learned].sort()]) {
      if (seen.has(b)) continue;
      seen.add(b);
      list.push(old.get(b) ?? this.make(b));
      old.delete(b);
    }
    for (const ep of old.values()) ep.close();
    this.list = list;
    this.next %= list.length;
  }

  all(): readonly Endpoint[] {
    return this.list;
  }
}

/** What the client knows of one of its claims. */
interface ClaimHint {
  leader: string; // API address, "" when unknown
  expiry: number; // ms since the epoch, 0 when unknown
}

type RetryRule = (err: unknown) => boolean;

const encoder = new TextEncoder();

function durationOf(ms: number): Duration | undefined {
  if (!ms) return undefined;
  const whole = Math.floor(ms / 1000);
  return { $typeName: "google.protobuf.Duration", seconds: BigInt(whole), nanos: Math.round((ms - whole * 1000) * 1e6) };
}

/** Waits ms, or less if signal aborts first: false then. */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    const onAbort = (): void => {
      clearTimeout(t);
      resolve(false);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A client of a Norn cluster. Make one per process and share it; close it
 * at the end.
 *
 * ```ts
 * const c = new Client("127.0.0.1:7400,127.0.0.1:7410", { tls: loadTls({ caFile, certFile, keyFile }) });
 * const id = await c.enqueue({ queue: "emails", payload: "hello" });
 * ```
 */
export class Client {
  readonly scheme: "http" | "https";
  private readonly eps: Endpoints;
  private readonly retry: Required<ClientRetryPolicy>;
  private readonly timeoutMs: number;
  private readonly w: number;
  private readonly usedToken: boolean;
  private readonly usedCert: boolean;
  private readonly certFile: string | undefined;
  private readonly hints = new Map<string, ClaimHint>();
  private closed = false;
  private used = false;
  private readonly discoveryIntervalMs: number;
  private discoveryTimer: NodeJS.Timeout | undefined;
  private discovering: Promise<void> | undefined;
  private readonly discoveryAbort = new AbortController();

  /**
   * addrs: one address or several (an array, or one string separated by
   * commas), each "host:port", "http://host:port" or "https://host:port",
   * all with the same scheme; without a scheme, https with tls and http
   * without. The client does not connect until the first call.
   */
  constructor(addrs: string | string[], opts: ClientOptions = {}) {
    const { bases, scheme } = parseSeeds(addrs, opts.tls ? "https" : "http");
    if (opts.tls && scheme !== "https") {
      throw new NornError(`norn: address list ${JSON.stringify(addrs)}: http with tls`, { kind: "bad_config", code: Code.InvalidArgument });
    }
    if (scheme === "https" && !opts.tls) {
      throw new NornError("norn: https addresses need tls (at least the cluster's CA: tls.ca)", { kind: "bad_config", code: Code.InvalidArgument });
    }
    if (opts.tls) checkTls(opts.tls, Date.now());
    this.scheme = scheme;
    this.retry = {
      maxAttempts: opts.retry?.maxAttempts ?? 5,
      baseBackoffMs: opts.retry?.baseBackoffMs ?? 50,
      maxBackoffMs: opts.retry?.maxBackoffMs ?? 2000,
    };
    if (!(this.retry.maxAttempts >= 1) || this.retry.baseBackoffMs < 0 || this.retry.maxBackoffMs < this.retry.baseBackoffMs) {
      throw new NornError(`norn: bad retry policy ${JSON.stringify(this.retry)}: need maxAttempts >= 1 and 0 <= baseBackoffMs <= maxBackoffMs`, { kind: "bad_config", code: Code.InvalidArgument });
    }
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.w = opts.w ?? 0;
    this.usedToken = !!opts.token;
    this.usedCert = !!opts.tls?.cert;
    this.certFile = opts.tls?.certFile;
    this.discoveryIntervalMs = opts.discoveryIntervalMs ?? DEFAULT_DISCOVERY_INTERVAL_MS;
    if (this.timeoutMs < 0 || this.discoveryIntervalMs < 0) {
      throw new NornError("norn: negative timeoutMs or discoveryIntervalMs", { kind: "bad_config", code: Code.InvalidArgument });
    }

    const interceptors: Interceptor[] = [];
    if (opts.token) {
      const value = `Bearer ${opts.token}`;
      interceptors.push((next) => (req) => {
        req.header.set("Authorization", value);
        return next(req);
      });
    }
    interceptors.push(...(opts.interceptors ?? []));
    const tls = opts.tls;
    const httpVersion = opts.httpVersion ?? "2";
    const agent =
      httpVersion === "1.1"
        ? scheme === "https"
          ? new https.Agent({ keepAlive: true, ca: tls?.ca, cert: tls?.cert, key: tls?.key, minVersion: "TLSv1.3" })
          : new http.Agent({ keepAlive: true })
        : undefined;
    this.eps = new Endpoints(bases, (base) => {
      let transport: Transport;
      let session: Http2SessionManager | undefined;
      if (httpVersion === "2") {
        session = new Http2SessionManager(
          base,
          { pingIntervalMs: 30_000, pingTimeoutMs: 15_000, idleConnectionTimeoutMs: 5 * 60_000 },
          tls ? { ca: tls.ca, cert: tls.cert, key: tls.key, minVersion: "TLSv1.3" } : {},
        );
        transport = createConnectTransport({ baseUrl: base, httpVersion: "2", sessionManager: session, useBinaryFormat: true, interceptors });
      } else {
        transport = createConnectTransport({ baseUrl: base, httpVersion: "1.1", nodeOptions: { agent }, useBinaryFormat: true, interceptors });
      }
      return {
        base,
        tasks: createClient(TaskService, transport),
        admin: createClient(AdminService, transport),
        queues: createClient(QueueService, transport),
        close: () => session?.abort(),
        failures: 0,
        downUntil: 0,
        failedAt: 0,
      };
    });
    this.closeAgent = () => agent?.destroy();
  }

  private readonly closeAgent: () => void;

  /** The base URLs calls go to: the seeds, then the nodes discovery learned. */
  endpoints(): string[] {
    return this.eps.all().map((ep) => ep.base);
  }

  /**
   * The raw connect TaskService client of one node (the first healthy
   * one), for what this class does not wrap. Its calls are not retried.
   */
  taskService(): ConnectClient<typeof TaskService> {
    return this.eps.pick(Date.now()).tasks;
  }

  /** Closes the connections and stops discovery. Calls after it fail (kind "closed"). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.discoveryTimer) clearTimeout(this.discoveryTimer);
    this.discoveryAbort.abort();
    for (const ep of this.eps.all()) ep.close();
    this.closeAgent();
  }

  // --- The call loop ------------------------------------------------------

  /**
   * Runs fn until it succeeds, fails with an error rule does not retry, or
   * the attempts run out (past them, it goes on while the next attempt
   * would start before untilMs). Each attempt goes to the endpoint picked
   * (another one than the last attempt's when one is healthy; the first to
   * leader when it is healthy) and updates its health.
   */
  private async call<T>(
    method: string,
    co: CallOptions | undefined,
    rule: RetryRule,
    fn: (ep: Endpoint, opts: { signal: AbortSignal; timeoutMs?: number }) => Promise<T>,
    extra: { leader?: string; untilMs?: number; extraMs?: number; ids?: () => bigint[] } = {},
  ): Promise<T> {
    if (this.closed) throw new NornError(`norn: ${method}: client closed`, { kind: "closed", code: Code.Canceled, method });
    this.firstUse();
    const timeout = co?.timeoutMs ?? this.timeoutMs;
    const deadline = timeout > 0 ? Date.now() + timeout + (extra.extraMs ?? 0) : Infinity;
    const ctl = new AbortController();
    const onAbort = (): void => ctl.abort(co?.signal?.reason);
    co?.signal?.addEventListener("abort", onAbort, { once: true });
    if (co?.signal?.aborted) ctl.abort(co.signal.reason);
    const timer = deadline < Infinity ? setTimeout(() => ctl.abort(new ConnectError("deadline", Code.DeadlineExceeded)), deadline - Date.now()) : undefined;
    const failures = new Map<string, string>();
    const until = Math.min(extra.untilMs ?? 0, deadline);
    let prev: Endpoint | undefined;
    let lastErr: unknown; // of the last attempt that was not cut short
    let lastAnswer: { err: unknown; node: string } | undefined; // the last error a node answered
    let lastAttempt = 0;
    let lastNode: string | undefined;
    try {
      for (let attempt = 1; ; attempt++) {
        const now = Date.now();
        let ep: Endpoint | undefined;
        if (attempt === 1 && extra.leader) ep = this.eps.preferred(now, `${this.scheme}://${extra.leader}`);
        ep ??= this.eps.pick(now, prev);
        lastNode = ep.base;
        try {
          const remaining = deadline - Date.now();
          const res = await fn(ep, { signal: ctl.signal, ...(remaining < Infinity ? { timeoutMs: Math.max(1, Math.floor(remaining)) } : {}) });
          this.eps.succeeded(ep);
          return res;
        } catch (err) {
          if (ctl.signal.aborted) break; // the caller's signal, or the deadline
          lastErr = err;
          lastAttempt = attempt;
          this.observe(ep, err);
          const tf = transportFailure(err);
          if (tf) failures.set(ep.base, tf.reason);
          else failures.delete(ep.base);
          prev = ep;
          const wait = backoffMs(this.retry, attempt);
          const more = attempt < this.retry.maxAttempts || Date.now() + wait < until;
          if (!more || !rule(err) || Date.now() + wait >= deadline) {
            throw this.finalError(err, lastAnswer, method, ep.base, attempt, failures, extra.ids);
          }
          if (!tf) lastAnswer = { err, node: ep.base };
          if (!(await sleep(wait, ctl.signal))) break;
        }
      }
      // Aborted, by the caller's signal or the call's deadline: report the
      // last answer or failure, if an attempt got one, as Go's client does.
      const byCaller = co?.signal?.aborted === true;
      const total = timeout + (extra.extraMs ?? 0);
      if (lastErr === undefined) {
        const why = byCaller ? "cancelled" : `no answer within ${total} ms`;
        throw new NornError(`norn: ${method}: ${why}${lastNode ? ` (node ${lastNode})` : ""}`, {
          kind: byCaller ? "canceled" : "deadline_exceeded",
          code: byCaller ? Code.Canceled : Code.DeadlineExceeded,
          method,
          node: lastNode,
          cause: co?.signal?.reason,
          ids: extra.ids?.() ?? [],
        });
      }
      const last = this.finalError(lastErr, lastAnswer, method, lastNode, lastAttempt, failures, extra.ids);
      throw new NornError(`${last.message} (gave up retrying: ${byCaller ? "cancelled" : `${total} ms passed`})`, {
        kind: last.kind,
        code: last.code,
        method,
        node: last.node,
        cause: lastErr,
        writeFailure: last.writeFailure,
        ids: last.ids,
        attempts: last.attempts,
      });
    } finally {
      if (timer) clearTimeout(timer);
      co?.signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * The error a call reports: its last one, except that when the last
   * attempt found its node unreachable after another node had answered,
   * the answer says more (a WriteFailure, say): it is reported, naming the
   * unreachable nodes too.
   */
  private finalError(
    err: unknown,
    lastAnswer: { err: unknown; node: string } | undefined,
    method: string,
    node: string | undefined,
    attempts: number,
    failures: Map<string, string>,
    ids?: () => bigint[],
  ): NornError {
    if (lastAnswer === undefined || transportFailure(err)?.kind !== "unreachable") {
      return toNornError(err, method, node, this.errOpts(attempts, failures, ids));
    }
    const answer = toNornError(lastAnswer.err, method, lastAnswer.node, this.errOpts(attempts, failures, ids));
    const down = [...failures].map(([n, r]) => `${n} (${r})`).join(", ");
    return new NornError(`${answer.message}; unreachable: ${down}`, {
      kind: answer.kind,
      code: answer.code,
      method,
      node: answer.node,
      cause: lastAnswer.err,
      writeFailure: answer.writeFailure,
      ids: answer.ids,
      attempts,
    });
  }

  private errOpts(attempts: number, failures: Map<string, string>, ids?: () => bigint[]) {
    return { attempts, failures, ids: ids?.() ?? [], usedToken: this.usedToken, usedCert: this.usedCert, ...(this.certFile ? { certFile: this.certFile } : {}) };
  }

  /** Updates ep's health after a failed attempt. */
  private observe(ep: Endpoint, err: unknown): void {
    const tf = transportFailure(err);
    if (tf) {
      if (tf.nodeDown && this.eps.failed(ep, Date.now())) this.kickDiscovery();
      return;
    }
    if (err instanceof ConnectError && err.code === Code.Unavailable && writeFailureOf(err) === undefined) {
      // The node answered that it cannot serve now (no leader reachable,
      // shutting down): go elsewhere for a while.
      this.eps.failed(ep, Date.now());
      return;
    }
    this.eps.succeeded(ep); // any other answer: the node is alive
  }

  /** Retry rules: see the README, "Retries". */
  private static noEffect(err: unknown): boolean {
    if (overBudget(err)) return true;
    const tf = transportFailure(err);
    return tf !== undefined && tf.neverSent && (tf.kind === "unreachable" || tf.kind === "unavailable");
  }

  private static idempotent(err: unknown): boolean {
    if (Client.noEffect(err)) return true;
    const tf = transportFailure(err);
    if (tf) return tf.kind === "unreachable";
    return err instanceof ConnectError && (err.code === Code.Unavailable || err.code === Code.DeadlineExceeded);
  }

  // --- Discovery ----------------------------------------------------------

  private firstUse(): void {
    if (this.used) return;
    this.used = true;
    if (this.discoveryIntervalMs > 0) this.scheduleDiscovery(0);
  }

  private scheduleDiscovery(ms: number): void {
    if (this.closed) return;
    if (this.discoveryTimer) clearTimeout(this.discoveryTimer);
    this.discoveryTimer = setTimeout(() => {
      this.discoveryTimer = undefined;
      this.discovering ??= this.refresh().finally(() => {
        this.discovering = undefined;
        this.scheduleDiscovery(this.discoveryIntervalMs);
      });
    }, ms);
    this.discoveryTimer.unref();
  }

  private kickDiscovery(): void {
    if (this.discoveryIntervalMs > 0 && this.used && !this.discovering) this.scheduleDiscovery(0);
  }

  /** Asks the endpoints in turn for Status and adds the live nodes it lists. */
  private async refresh(): Promise<void> {
    let prev: Endpoint | undefined;
    for (let i = 0; i < this.eps.all().length; i++) {
      const ep = this.eps.pick(Date.now(), prev);
      prev = ep;
      let resp: StatusResponse;
      try {
        resp = await ep.admin.status(
          { skipCounts: true },
          { signal: this.discoveryAbort.signal, timeoutMs: Math.min(MAX_STATUS_TIMEOUT_MS, this.timeoutMs || MAX_STATUS_TIMEOUT_MS) },
        );
      } catch (err) {
        if (this.closed) return;
        this.observe(ep, err);
        continue;
      }
      if (resp.nodes.length === 0) return;
      const learned: string[] = [];
      for (const n of resp.nodes) {
        if (n.state !== "alive" && n.state !== "suspect") continue;
        const b = this.nodeBase(n.apiAddress);
        if (b) learned.push(b);
      }
      this.eps.set(learned);
      return;
    }
  }

  private nodeBase(apiAddress: string): string | undefined {
    if (!apiAddress) return undefined;
    try {
      const p = parseAddr(apiAddress, this.scheme);
      if (p.scheme !== this.scheme) return undefined;
      const host = new URL(p.base).hostname;
      if (host === "" || host === "0.0.0.0" || host === "[::]") return undefined;
      return p.base;
    } catch {
      return undefined;
    }
  }

  // --- Claim hints -----------------------------------------------------------

  private noteHint(id: bigint, leader: string, expiry: number): void {
    if (!leader && !expiry) return;
    const k = id.toString();
    if (!this.hints.has(k) && this.hints.size >= MAX_HINTS) {
      const first = this.hints.keys().next();
      if (!first.done) this.hints.delete(first.value);
    }
    this.hints.set(k, { leader, expiry });
  }

  private hint(id: bigint, done: boolean): ClaimHint {
    const k = id.toString();
    const h = this.hints.get(k) ?? { leader: "", expiry: 0 };
    if (done) this.hints.delete(k);
    return h;
  }

  /**
   * The calls on a claim (renew, update, complete, abort, yield) retry
   * UNAVAILABLE for as long as the claim's lease lasts, as the client last
   * learned it (a partition is without a leader for a second or three when
   * its leader fails), and go first to the partition's leader.
   */
  private claimCall<T>(method: string, id: bigint, done: boolean, co: CallOptions | undefined, fn: (ep: Endpoint, o: { signal: AbortSignal; timeoutMs?: number }) => Promise<T>): Promise<T> {
    const h = this.hint(id, done);
    return this.call(method, co, Client.idempotent, fn, { leader: h.leader, untilMs: h.expiry });
  }

  // --- TaskService ------------------------------------------------------------

  /**
   * Stores one new task and returns its id. Retried with the same id: the
   * caller's (opts.id: any UNAVAILABLE), or the one a WriteFailure names
   * (an UNAVAILABLE from a missed write quorum); never an id-less enqueue
   * whose fate is unknown, so a retry cannot make a second task. A failed
   * call whose id is known has it in NornError.ids: retry with it.
   */
  async enqueue(spec: TaskSpecInit, opts: EnqueueOptions = {}): Promise<bigint> {
    return (await this.enqueueWithResult(spec, opts)).id;
  }

  /** enqueue, answering acks and whether the task was a duplicate (unique keys). */
  async enqueueWithResult(spec: TaskSpecInit, opts: EnqueueOptions = {}): Promise<EnqueueResult> {
    const req = create(EnqueueRequestSchema, { task: specOf(spec), id: opts.id ?? 0n, w: opts.w ?? this.w });
    const rule: RetryRule = (err) => {
      const wf = writeFailureOf(err);
      if (wf && wf.ids.length === 1 && wf.ids[0] !== 0n && req.id === 0n) req.id = wf.ids[0]!;
      return req.id !== 0n ? Client.idempotent(err) : Client.noEffect(err);
    };
    const resp = await this.call("enqueue", opts, rule, (ep, o) => ep.tasks.enqueue(req, o), { ids: () => (req.id !== 0n ? [req.id] : []) });
    return { id: resp.id, acks: resp.acks, duplicate: resp.duplicate };
  }

  /**
   * Stores up to 10,000 tasks in one call and returns their ids in order.
   * It succeeds only when every task reached the write quorum; retried as
   * enqueue, with the ids of the WriteFailure.
   */
  async enqueueBatch(specs: TaskSpecInit[], opts: Omit<EnqueueOptions, "id"> & { ids?: bigint[] } = {}): Promise<bigint[]> {
    if (specs.length === 0 || specs.length > 10_000) {
      throw new NornError("norn: enqueue batch: need 1 to 10,000 tasks", { kind: "invalid_argument", code: Code.InvalidArgument, method: "enqueue batch" });
    }
    if (opts.ids && opts.ids.length !== specs.length) {
      throw new NornError("norn: enqueue batch: ids needs one id per task", { kind: "invalid_argument", code: Code.InvalidArgument, method: "enqueue batch" });
    }
    const req = create(EnqueueBatchRequestSchema, { tasks: specs.map(specOf), ids: opts.ids ?? [], w: opts.w ?? this.w });
    const known = (): boolean => req.ids.length === specs.length && req.ids.every((id) => id !== 0n);
    const rule: RetryRule = (err) => {
      const wf = writeFailureOf(err);
      if (wf && wf.ids.length === specs.length && !known()) req.ids = [...wf.ids];
      return known() ? Client.idempotent(err) : Client.noEffect(err);
    };
    const resp = await this.call("enqueue batch", opts, rule, (ep, o) => ep.tasks.enqueueBatch(req, o), { ids: () => (known() ? req.ids : []) });
    return resp.ids;
  }

  /** Reads a task (r: read quorum, 0: a majority). NOT_FOUND: kind "not_found". */
  async getTask(id: bigint, opts: CallOptions & { r?: number } = {}): Promise<Task> {
    const resp = await this.call("get task", opts, Client.idempotent, (ep, o) => ep.tasks.getTask({ id, r: opts.r ?? 0 }, o));
    if (!resp.task) throw new NornError(`norn: get task: no task in the answer`, { kind: "other", code: Code.Internal, method: "get task" });
    return resp.task;
  }

  /** One page of tasks (see ListTasksRequest); page with nextPageToken. */
  listTasks(req: MessageInitShape<typeof ListTasksRequestSchema>, opts: CallOptions = {}): Promise<ListTasksResponse> {
    return this.call("list tasks", opts, Client.idempotent, (ep, o) => ep.tasks.listTasks(req, o));
  }

  /** Counts tasks by status (of a queue, or of all). */
  countTasks(queue = "", opts: CallOptions = {}): Promise<CountTasksResponse> {
    return this.call("count tasks", opts, Client.idempotent, (ep, o) => ep.tasks.countTasks({ queue }, o));
  }

  /**
   * Claims up to max tasks of a queue, long-polling up to waitMs. Not
   * idempotent: retried only when the request provably reached no node.
   */
  async claim(opts: ClaimOptions): Promise<ClaimedTask[]> {
    if ((opts.max ?? 0) < 0 || (opts.leaseMs ?? 0) < 0 || (opts.waitMs ?? 0) < 0) {
      throw new NornError("norn: claim: negative max, leaseMs or waitMs", { kind: "invalid_argument", code: Code.InvalidArgument, method: "claim" });
    }
    const req = create(ClaimRequestSchema, {
      queue: opts.queue,
      worker: opts.worker || defaultWorkerName(),
      max: opts.max ?? 0,
      lease: durationOf(opts.leaseMs ?? 0),
      wait: durationOf(opts.waitMs ?? 0),
    });
    const resp = await this.call("claim", opts, Client.noEffect, (ep, o) => ep.tasks.claim(req, o), { extraMs: opts.waitMs ?? 0 });
    for (const ct of resp.tasks) {
      if (ct.task) this.noteHint(ct.task.id, ct.leader, ct.expiry ? timestampDate(ct.expiry).getTime() : 0);
    }
    return resp.tasks;
  }

  /**
   * Extends a live claim's lease to leaseMs from now (0: the server's
   * default) and returns the new expiry (the server's clock). Kind
   * "superseded" means the claim has ended or the task was cancelled: stop
   * working on it.
   */
  async renew(id: bigint, claimId: bigint, leaseMs = 0, opts: CallOptions = {}): Promise<Date> {
    const resp = await this.claimCall("renew", id, false, opts, (ep, o) => ep.tasks.renew({ id, claimId, lease: durationOf(leaseMs) }, o));
    const expiry = resp.expiry ? timestampDate(resp.expiry) : new Date(Date.now() + leaseMs);
    const h = this.hints.get(id.toString());
    if (h) h.expiry = expiry.getTime();
    return expiry;
  }

  /** Records a progress report under a claim; seq must grow per claim. */
  async update(id: bigint, claimId: bigint, seq: bigint, progress: number, message = "", data?: Uint8Array, opts: CallOptions & { w?: number } = {}): Promise<void> {
    const req = create(UpdateRequestSchema, { id, claimId, seq, progress, message, data: data ?? new Uint8Array(), w: opts.w ?? this.w });
    await this.claimCall("update", id, false, opts, (ep, o) => ep.tasks.update(req, o));
  }

  /** Ends the claim and the task: COMPLETED, with result. */
  async complete(id: bigint, claimId: bigint, result?: Uint8Array | string, opts: CallOptions & { w?: number } = {}): Promise<void> {
    const r = typeof result === "string" ? encoder.encode(result) : (result ?? new Uint8Array());
    await this.claimCall("complete", id, true, opts, (ep, o) => ep.tasks.complete({ id, claimId, result: r, w: opts.w ?? this.w }, o));
  }

  /**
   * Ends the claim with errors: the task is ABORTED for good, or, with
   * retry, the attempt failed and the task is retried after its backoff
   * (DEAD after its last attempt).
   */
  async abort(id: bigint, claimId: bigint, errors: TaskErrorInit[], opts: CallOptions & { w?: number; retry?: boolean } = {}): Promise<void> {
    await this.claimCall("abort", id, true, opts, (ep, o) => ep.tasks.abort({ id, claimId, errors, w: opts.w ?? this.w, retry: opts.retry ?? false }, o));
  }

  /** A failed attempt: abort with retry (the task is retried after its backoff). */
  fail(id: bigint, claimId: bigint, errors: TaskErrorInit[], opts: CallOptions & { w?: number } = {}): Promise<void> {
    return this.abort(id, claimId, errors, { ...opts, retry: true });
  }

  /** Gives the task back now (READY), with the progress made. */
  async yield(id: bigint, claimId: bigint, progress = 0, opts: CallOptions = {}): Promise<void> {
    await this.claimCall("yield", id, true, opts, (ep, o) => ep.tasks.yield({ id, claimId, progress }, o));
  }

  /** Cancels a task that has not ended (cancelling a cancelled task succeeds). */
  async cancel(id: bigint, opts: CallOptions & { w?: number } = {}): Promise<void> {
    await this.call("cancel", opts, Client.idempotent, (ep, o) => ep.tasks.cancel({ id, w: opts.w ?? this.w }, o));
  }

  /**
   * Gives a DEAD, ABORTED or CANCELLED task a new life; with life (the one
   * read terminal) a repeated retry changes nothing, so it is retried.
   */
  async retryTask(id: bigint, opts: CallOptions & { life?: number; w?: number } = {}): Promise<number> {
    const rule = opts.life !== undefined ? Client.idempotent : Client.noEffect;
    const resp = await this.call("retry", opts, rule, (ep, o) => ep.tasks.retry({ id, life: opts.life, w: opts.w ?? this.w }, o));
    return resp.life;
  }

  /** The answering node's view of the cluster (AdminService.Status). */
  status(opts: CallOptions & { skipCounts?: boolean } = {}): Promise<StatusResponse> {
    return this.call("status", opts, Client.idempotent, (ep, o) => ep.admin.status({ skipCounts: opts.skipCounts ?? false }, o));
  }
}

function specOf(spec: TaskSpecInit): MessageInitShape<typeof TaskSpecSchema> {
  const { payload, ...rest } = spec;
  return { ...rest, payload: typeof payload === "string" ? encoder.encode(payload) : (payload ?? new Uint8Array()) };
}

/** "<hostname>/<pid>": the worker name of a claim that names none. */
export function defaultWorkerName(): string {
  return `${hostname()}/${process.pid}`;
}
