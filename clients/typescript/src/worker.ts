// The Worker: claims tasks from a queue, runs a handler on each while it
// renews the lease, and settles the claim by what the handler did. It
// follows the Go client's Worker (client/worker.go).

import { hostname } from "node:os";
import { Code } from "@connectrpc/connect";
import type { Client } from "./client.js";
import { backoffMs, sleep } from "./client.js";
import type { ClaimedTask, Task } from "./gen/norn/v1/task_pb.js";
import {
  LeaseExpired,
  NornError,
  PermanentError,
  TaskFailure,
  WorkerShutdown,
  YieldTask,
  isPermanent,
  isSuperseded,
} from "./errors.js";

/** Code of an abort caused by a handler error that is not a TaskFailure. */
export const CODE_HANDLER_ERROR = "handler_error";

/** Where the Worker reports what goes wrong (console by default). */
export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

/**
 * Does the work of one task and returns its result (stored with Complete;
 * a string is stored as UTF-8). Throwing aborts the task: see Worker. It
 * must return soon after task.signal aborts: the claim is lost, the task
 * was cancelled, or the worker is stopping (task.signal.reason says which).
 */
export type Handler = (task: WorkerTask) => Promise<Uint8Array | string | void> | Uint8Array | string | void;

/** Options of a Worker. */
export interface WorkerOptions {
  /** Queue to claim from. Required. */
  queue: string;
  /** Does the work. Required. */
  handler: Handler;
  /** The worker's name in the claim history. Default "<hostname>/<pid>". */
  name?: string;
  /** Most tasks held (handlers running) at once. Default 1; at most 10,000. */
  concurrency?: number;
  /** Lease of every claim, renewed about every third of it. Default 30 s; at least 100 ms. */
  leaseMs?: number;
  /** How long one claim long-polls. Default 20 s. */
  waitMs?: number;
  /** Stop on SIGINT and SIGTERM while run() runs. Default true. */
  handleSignals?: boolean;
  /** Default: console, prefixed "norn:". */
  logger?: Logger;
}

const consoleLogger: Logger = {
  info: (msg, f) => console.info(msg, f ?? ""),
  warn: (msg, f) => console.warn(msg, f ?? ""),
  error: (msg, f) => console.error(msg, f ?? ""),
};

const MAX_DESCRIPTION = 16 << 10;

/** One claimed task, as a handler sees it. */
export class WorkerTask {
  /** The task's id. */
  readonly id: bigint;
  /** The claim the worker holds. */
  readonly claimId: bigint;
  /** The task's payload. */
  readonly payload: Uint8Array;
  /** The task as of the claim: spec, claim history, earlier updates. */
  readonly info: Task;
  /** Aborted when the handler must stop; its reason says why. */
  readonly signal: AbortSignal;
  /**
   * The API address (host:port) of the node that led the task's partition
   * when the claim was granted: where the renews go first. A hint.
   */
  readonly leader: string;
  private seq = 0n;
  private okSeq = 0n;
  private prog = 0;

  /** @internal */
  constructor(
    private readonly client: Client,
    ct: ClaimedTask,
    signal: AbortSignal,
    private readonly gone: (err: unknown) => void,
  ) {
    this.info = ct.task!;
    this.id = this.info.id;
    this.claimId = ct.claimId;
    this.leader = ct.leader;
    this.payload = this.info.spec?.payload ?? new Uint8Array();
    this.signal = signal;
  }

  /** The payload as UTF-8 text. */
  text(): string {
    return new TextDecoder().decode(this.payload);
  }

  /** Reports progress (0 to 1) and a status line. */
  progress(progress: number, message = ""): Promise<void> {
    return this.update(progress, message);
  }

  /**
   * Records a progress report under the claim, with the next sequence
   * number; data is opaque (a checkpoint). When it fails because the claim
   * has ended, the handler's signal is aborted too.
   */
  async update(progress: number, message = "", data?: Uint8Array): Promise<void> {
    const seq = ++this.seq;
    try {
      await this.client.update(this.id, this.claimId, seq, progress, message, data);
    } catch (err) {
      if (isSuperseded(err)) this.gone(err);
      throw err;
    }
    if (seq > this.okSeq) {
      this.okSeq = seq;
      this.prog = progress;
    }
  }

  /** @internal The latest progress the server accepted. */
  lastProgress(): number {
    return this.prog;
  }
}

type Outcome = "complete" | "abort" | "fail" | "yield" | "none";

/**
 * Claims tasks from one queue and runs the handler on each, at most
 * `concurrency` at a time, renewing each lease about every third of it
 * while the handler runs. When the handler returns:
 *
 * - a result (or nothing): Complete with it, also while stopping;
 * - after the claim was reported ended (superseded, cancelled): nothing;
 * - when the lease ran out before a renew succeeded: Yield (another worker
 *   may hold the task now: the result is not used);
 * - a throw after the worker aborted the handler's signal (stopping), or a
 *   YieldTask: Yield, with the last progress reported;
 * - a throw of a PermanentError (permanent(err)): Abort, the task is
 *   ABORTED for good;
 * - any other throw: a failed attempt (Abort with retry): the task is
 *   retried after its backoff (TaskSpec.retry, or the server's default
 *   policy), DEAD after its last attempt.
 *
 * The abort's error is the TaskFailure thrown (its code, description and
 * args), or else code "handler_error" with the error's text. Delivery is
 * at least once: handlers should be idempotent.
 *
 * run() stops on stop(), or on SIGINT or SIGTERM (handleSignals): it stops
 * claiming, aborts the handlers' signals, waits for every handler to
 * return and settles its task as above, then resolves.
 */
export class Worker {
  private readonly opts: Required<Omit<WorkerOptions, "logger">> & { logger: Logger };
  private readonly log: Logger;
  private started = false;
  private stopping = false;
  private readonly stopCtl = new AbortController();
  private readonly running = new Set<Promise<void>>();
  private readonly handlerCtls = new Set<AbortController>();
  private slotWaiter: (() => void) | undefined;
  private done: Promise<void> | undefined;

  constructor(
    private readonly client: Client,
    opts: WorkerOptions,
  ) {
    const bad = (msg: string): NornError => new NornError(`norn: worker: ${msg}`, { kind: "bad_config", code: Code.InvalidArgument });
    if (!opts.queue) throw bad("queue is required");
    if (typeof opts.handler !== "function") throw bad("handler is required");
    const concurrency = opts.concurrency ?? 1;
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 10_000) throw bad(`concurrency ${concurrency}: want 1 to 10,000`);
    const leaseMs = opts.leaseMs ?? 30_000;
    if (!(leaseMs >= 100)) throw bad(`leaseMs ${leaseMs}: want at least 100`);
    const waitMs = opts.waitMs ?? 20_000;
    if (!(waitMs >= 0)) throw bad(`waitMs ${waitMs}: negative`);
    this.opts = {
      queue: opts.queue,
      handler: opts.handler,
      name: opts.name ?? `${hostname()}/${process.pid}`,
      concurrency,
      leaseMs,
      waitMs,
      handleSignals: opts.handleSignals ?? true,
      logger: opts.logger ?? consoleLogger,
    };
    this.log = this.opts.logger;
  }

  /**
   * Stops the worker: no more claims, the handlers' signals are aborted
   * (reason WorkerShutdown), and the held tasks are settled. Resolves when
   * run() has returned.
   */
  async stop(): Promise<void> {
    this.requestStop();
    await this.done?.catch(() => undefined);
  }

  private requestStop(): void {
    if (this.stopping) return;
    this.stopping = true;
    this.stopCtl.abort(new WorkerShutdown());
    this.slotWaiter?.();
  }

  /**
   * Claims and handles tasks until stop() or a signal, then settles the
   * held tasks and resolves. A claim that fails with an error retrying
   * cannot fix (INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED,
   * UNIMPLEMENTED, a TLS failure) stops the worker the same way, and run()
   * rejects with it. Other claim errors are logged and retried with
   * backoff. run() may be called once.
   */
  run(): Promise<void> {
    if (this.started) return Promise.reject(new Error("norn: Worker.run called twice"));
    this.started = true;
    this.done = this.loop();
    return this.done;
  }

  private async loop(): Promise<void> {
    const onSignal = (sig: NodeJS.Signals): void => {
      this.log.info(`norn: worker ${this.opts.name}: ${sig}: stopping`);
      this.requestStop();
    };
    if (this.opts.handleSignals) {
      process.on("SIGINT", onSignal);
      process.on("SIGTERM", onSignal);
    }
    let runErr: unknown;
    let failures = 0;
    try {
      while (!this.stopping) {
        const free = this.opts.concurrency - this.running.size;
        if (free <= 0) {
          await new Promise<void>((resolve) => (this.slotWaiter = resolve));
          this.slotWaiter = undefined;
          continue;
        }
        const n = Math.min(free, 1000);
        const sent = Date.now();
        let tasks: ClaimedTask[];
        try {
          tasks = await this.client.claim({
            queue: this.opts.queue,
            worker: this.opts.name,
            leaseMs: this.opts.leaseMs,
            max: n,
            waitMs: this.opts.waitMs,
            signal: this.stopCtl.signal,
          });
          failures = 0;
        } catch (err) {
          if (this.stopping) break;
          if (permanentClaimError(err)) {
            this.log.error("norn: claim failed; stopping the worker", { err: String(err) });
            runErr = err;
            this.requestStop();
            break;
          }
          failures++;
          this.log.warn("norn: claim failed; retrying", { err: String(err), failures });
          await sleep(backoffMs({ maxAttempts: 0, baseBackoffMs: 50, maxBackoffMs: 2000 }, failures), this.stopCtl.signal);
          continue;
        }
        for (const ct of tasks.slice(n)) {
          // Never from a correct server: give back the extra.
          void this.settle(ct.task!.id, ct.claimId, "yield", undefined, undefined, 0, undefined);
        }
        for (const ct of tasks.slice(0, n)) {
          if (!ct.task) continue;
          const p = this.runTask(ct, sent).finally(() => {
            this.running.delete(p);
            this.slotWaiter?.();
          });
          this.running.add(p);
        }
        if (tasks.length === 0 && Date.now() - sent < this.opts.waitMs / 2) {
          await sleep(50, this.stopCtl.signal); // an early empty answer: do not spin
        }
      }
    } finally {
      // The claim loop has stopped: now stop the handlers and wait for them.
      for (const ctl of this.handlerCtls) ctl.abort(new WorkerShutdown());
      while (this.running.size > 0) await Promise.allSettled([...this.running]);
      if (this.opts.handleSignals) {
        process.off("SIGINT", onSignal);
        process.off("SIGTERM", onSignal);
      }
    }
    if (runErr !== undefined) throw runErr;
  }

  /** Runs the handler on one task, renewing its lease, and settles the claim. */
  private async runTask(ct: ClaimedTask, sent: number): Promise<void> {
    const id = ct.task!.id;
    if (this.stopping) {
      await this.settle(id, ct.claimId, "yield", undefined, undefined, 0, undefined);
      return;
    }
    const ctl = new AbortController();
    this.handlerCtls.add(ctl);
    let claimGone = false;
    const gone = (err: unknown): void => {
      claimGone = true;
      ctl.abort(err);
    };
    const task = new WorkerTask(this.client, ct, ctl.signal, gone);
    const lease = { end: sent + this.opts.leaseMs };
    const renewCtl = new AbortController();
    const renewing = this.renew(task, sent, lease, renewCtl.signal, ctl, gone);

    let result: Uint8Array | string | void = undefined;
    let herr: unknown;
    let threw = false;
    try {
      result = await this.opts.handler(task);
    } catch (err) {
      threw = true;
      herr = err;
    }
    renewCtl.abort();
    await renewing;
    this.handlerCtls.delete(ctl);

    let oc: Outcome;
    if (claimGone) {
      oc = "none";
      this.log.info("norn: claim ended while the handler ran", { task: String(id), claim: String(ct.claimId), cause: String(ctl.signal.reason) });
    } else if (ctl.signal.reason instanceof LeaseExpired || Date.now() >= lease.end) {
      // The lease ran out by this worker's clock: another worker may hold
      // the task now, so it is given back (a yield the node refuses if the
      // claim has ended), never completed.
      oc = "yield";
      this.log.warn("norn: the lease ran out before the handler returned; yielding, not completing", { task: String(id), claim: String(ct.claimId) });
    } else if (!threw) {
      oc = "complete";
    } else if (ctl.signal.aborted || herr instanceof YieldTask) {
      oc = "yield";
    } else if (isPermanent(herr)) {
      oc = "abort";
    } else {
      oc = "fail";
    }
    // A complete or abort is retried for as long as the lease lasts: the
    // work is not thrown away because a partition changes leader.
    const timeoutMs = oc === "yield" || oc === "none" ? undefined : Math.max(1, lease.end - Date.now());
    await this.settle(id, ct.claimId, oc, result, herr, task.lastProgress(), timeoutMs);
  }

  /**
   * Renews the lease about every third of it until signal aborts, the first
   * time a third after the claim was sent. A "superseded" answer ends the
   * claim (gone); a lease that runs out before a renew succeeds aborts the
   * handler with LeaseExpired.
   */
  private async renew(task: WorkerTask, sent: number, lease: { end: number }, signal: AbortSignal, handler: AbortController, gone: (err: unknown) => void): Promise<void> {
    const interval = this.opts.leaseMs / 3;
    let wait = Math.max(0, sent + interval - Date.now());
    for (;;) {
      if (!(await sleep(wait, signal))) return;
      const start = Date.now();
      const deadline = lease.end;
      try {
        await this.client.renew(task.id, task.claimId, this.opts.leaseMs, { signal, timeoutMs: Math.max(1, deadline - start) });
        lease.end = start + this.opts.leaseMs;
        wait = interval;
      } catch (err) {
        if (signal.aborted) return;
        if (isSuperseded(err)) {
          gone(err);
          return;
        }
        if (Date.now() >= deadline) {
          this.log.warn("norn: lease ran out before a renew succeeded", { task: String(task.id), claim: String(task.claimId), err: String(err) });
          handler.abort(new LeaseExpired());
          return;
        }
        this.log.warn("norn: renew failed; retrying", { task: String(task.id), claim: String(task.claimId), err: String(err) });
        wait = Math.min(interval / 3, deadline - Date.now());
      }
    }
  }

  /** Ends a claim as oc says; a failure is logged (the lease then expires). */
  private async settle(id: bigint, claimId: bigint, oc: Outcome, result: Uint8Array | string | void, herr: unknown, progress: number, timeoutMs: number | undefined): Promise<void> {
    const co = timeoutMs === undefined ? {} : { timeoutMs };
    try {
      switch (oc) {
        case "none":
          return;
        case "complete":
          await this.client.complete(id, claimId, result ?? undefined, co);
          return;
        case "yield":
          await this.client.yield(id, claimId, progress, co);
          return;
        case "abort":
          await this.client.abort(id, claimId, [abortError(herr)], co);
          return;
        case "fail":
          await this.client.fail(id, claimId, [abortError(herr)], co);
          return;
      }
    } catch (err) {
      this.log.warn("norn: could not end the claim; the lease will expire", { task: String(id), claim: String(claimId), outcome: oc, err: String(err) });
    }
  }
}

/** Whether a claim error will not go away by retrying. */
function permanentClaimError(err: unknown): boolean {
  if (err instanceof NornError) {
    switch (err.kind) {
      case "untrusted_node":
      case "certificate_rejected":
      case "certificate_expired":
      case "tls":
      case "bad_config":
      case "closed":
        return true;
    }
    switch (err.code) {
      case Code.InvalidArgument:
      case Code.PermissionDenied:
      case Code.Unauthenticated:
      case Code.Unimplemented:
        return true;
    }
  }
  return false;
}

/** The abort's TaskError for a handler's error. */
export function abortError(err: unknown): { code: string; description: string; args: string[] } {
  const e: unknown = err instanceof PermanentError ? err.error : err;
  if (e instanceof TaskFailure) {
    return { code: truncate(e.code || CODE_HANDLER_ERROR), description: truncate(e.description), args: [...e.args] };
  }
  const text = e instanceof Error ? e.message || e.name : typeof e === "string" ? e : safeString(e);
  return { code: CODE_HANDLER_ERROR, description: truncate(text), args: [] };

  function safeString(v: unknown): string {
    try {
      return typeof v === "object" && v !== null ? JSON.stringify(v) : String(v);
    } catch {
      return String(v);
    }
  }
}

/** s as valid UTF-8 of at most 16 KiB. */
function truncate(s: string): string {
  const enc = new TextEncoder();
  const b = enc.encode(s);
  if (b.length <= MAX_DESCRIPTION) return s;
  let cut = MAX_DESCRIPTION;
  while (cut > 0 && (b[cut]! & 0xc0) === 0x80) cut--;
  return new TextDecoder().decode(b.subarray(0, cut));
}

