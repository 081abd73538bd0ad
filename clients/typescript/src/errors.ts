// Errors of the Norn client: every failure a Client or Worker reports is a
// NornError, which keeps the Connect code (docs/API.md "Errors") and adds
// a `kind` naming what is wrong in words a caller can act on: no node
// reachable, a certificate the node refused, a revoked token, a payload
// over the limit.

import { Code, ConnectError } from "@connectrpc/connect";
import type { WriteFailure } from "./gen/norn/v1/error_details_pb.js";
import { WriteFailureSchema } from "./gen/norn/v1/error_details_pb.js";

export { Code, ConnectError };

/**
 * What went wrong, by what a caller does about it.
 *
 * - `unreachable`: no node could be connected to (refused, reset, timed
 *   out, the name did not resolve); the message names each node tried.
 * - `untrusted_node`: a node's TLS certificate did not verify against the
 *   CA the client was given (another cluster's, or the wrong host name).
 * - `certificate_rejected`: the node refused the client certificate (not
 *   issued by the cluster's CA, or malformed).
 * - `certificate_expired`: the client certificate has expired or is not
 *   valid yet (found when the client is made, or the node said so).
 * - `tls`: another TLS failure (for example https to a cleartext node).
 * - `unauthenticated`: UNAUTHENTICATED: no credentials, or a bearer token
 *   that is unknown or revoked.
 * - `permission_denied`: PERMISSION_DENIED: the caller's grants do not
 *   allow the call (the message names the caller, method and queue).
 * - `payload_too_large`: a payload, result or update data over the
 *   node's limit (`-max-payload-bytes`, 1 MiB by default): the node's
 *   INVALID_ARGUMENT naming the field.
 * - `request_too_large`: a whole request over the node's request size
 *   limit (RESOURCE_EXHAUSTED).
 * - `superseded`: FAILED_PRECONDITION: the claim has ended (expired,
 *   yielded, superseded) or the task is terminal, for example cancelled.
 * - `not_found`, `already_exists`, `invalid_argument`, `unavailable`,
 *   `deadline_exceeded`, `canceled`, `resource_exhausted`: the code of
 *   that name.
 * - `closed`: the Client was closed.
 * - `bad_config`: the client's options are wrong (thrown by the
 *   constructor or loadTls).
 * - `other`: any other code (INTERNAL, UNIMPLEMENTED, ...).
 */
export type ErrorKind =
  | "unreachable"
  | "untrusted_node"
  | "certificate_rejected"
  | "certificate_expired"
  | "tls"
  | "unauthenticated"
  | "permission_denied"
  | "payload_too_large"
  | "request_too_large"
  | "superseded"
  | "not_found"
  | "already_exists"
  | "invalid_argument"
  | "unavailable"
  | "deadline_exceeded"
  | "canceled"
  | "resource_exhausted"
  | "closed"
  | "bad_config"
  | "other";

/** Fields of a NornError besides its message. */
export interface NornErrorInit {
  kind: ErrorKind;
  code: Code;
  method?: string;
  node?: string;
  cause?: unknown;
  writeFailure?: WriteFailure;
  ids?: bigint[];
  attempts?: number;
}

/**
 * The error of every Client and Worker call that fails. `code` is the
 * Connect code (the server's, or the one the transport failure maps to),
 * `kind` says what is wrong, `method` and `node` say which call and which
 * node (the base URL of its last attempt), `cause` is the underlying
 * ConnectError or Node.js error.
 */
export class NornError extends Error {
  override name = "NornError";
  readonly kind: ErrorKind;
  readonly code: Code;
  readonly method: string;
  readonly node: string | undefined;
  /** The WriteFailure detail of an UNAVAILABLE write, if it had one. */
  readonly writeFailure: WriteFailure | undefined;
  /**
   * Ids the call used when it failed: for an enqueue whose id is known
   * (given by the caller, or named by a WriteFailure), retry with it.
   */
  readonly ids: bigint[];
  /** How many attempts the call made. */
  readonly attempts: number;

  constructor(message: string, init: NornErrorInit) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.kind = init.kind;
    this.code = init.code;
    this.method = init.method ?? "";
    this.node = init.node;
    this.writeFailure = init.writeFailure;
    this.ids = init.ids ?? [];
    this.attempts = init.attempts ?? 0;
  }
}

/** The Connect code of err: a NornError's or ConnectError's, else UNKNOWN. */
export function codeOf(err: unknown): Code {
  if (err instanceof NornError) return err.code;
  if (err instanceof ConnectError) return err.code;
  return Code.Unknown;
}

/**
 * FAILED_PRECONDITION: the claim has ended or the task is terminal (for
 * example cancelled). A worker holding the task must stop working on it.
 */
export function isSuperseded(err: unknown): boolean {
  return codeOf(err) === Code.FailedPrecondition;
}

/** NOT_FOUND: no such task. */
export function isNotFound(err: unknown): boolean {
  return codeOf(err) === Code.NotFound;
}

/** UNAVAILABLE, after the client's retries. A write may have taken effect. */
export function isUnavailable(err: unknown): boolean {
  return codeOf(err) === Code.Unavailable;
}

/** The WriteFailure detail of an UNAVAILABLE write error, if any. */
export function writeFailureOf(err: unknown): WriteFailure | undefined {
  if (err instanceof NornError) return err.writeFailure;
  if (err instanceof ConnectError) {
    try {
      return err.findDetails(WriteFailureSchema)[0];
    } catch {
      return undefined;
    }
  }
  return undefined;
}

// --- Transport failures --------------------------------------------------

/** The Node.js error codes found along err's chain of causes. */
export function nodeCodes(err: unknown): string[] {
  const codes: string[] = [];
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e instanceof Error && !seen.has(e)) {
    seen.add(e);
    const c = (e as { code?: unknown }).code;
    if (typeof c === "string") codes.push(c);
    e = (e as { cause?: unknown }).cause;
  }
  return codes;
}

/** Failures to connect that prove the request never reached a node. */
const neverSent: Record<string, string> = {
  ECONNREFUSED: "connection refused",
  ENOTFOUND: "host name did not resolve",
  EAI_AGAIN: "host name did not resolve (temporary failure)",
  EHOSTUNREACH: "host unreachable",
  ENETUNREACH: "network unreachable",
};

/** Failures of a connection that may have carried the request. */
const connectionLost: Record<string, string> = {
  ECONNRESET: "connection reset",
  ECONNABORTED: "connection aborted",
  EPIPE: "connection closed",
  ETIMEDOUT: "connection timed out",
  ERR_HTTP2_GOAWAY_SESSION: "the node closed the connection (GOAWAY)",
  ERR_HTTP2_SESSION_ERROR: "HTTP/2 session error",
  ERR_HTTP2_STREAM_ERROR: "HTTP/2 stream error",
  ERR_HTTP2_INVALID_SESSION: "HTTP/2 session closed",
  ERR_HTTP2_STREAM_CANCEL: "HTTP/2 stream cancelled",
  ERR_HTTP2_PING_CANCEL: "HTTP/2 ping cancelled",
  ERR_HTTP2_ERROR: "HTTP/2 protocol error",
  ERR_STREAM_PREMATURE_CLOSE: "connection closed early",
  ERR_SOCKET_CONNECTION_TIMEOUT: "connection timed out",
  UND_ERR_SOCKET: "connection closed",
};

/** A node's certificate the client could not verify (Node.js codes). */
const untrustedNode: Record<string, string> = {
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: "its certificate is not signed by the CA the client was given",
  UNABLE_TO_GET_ISSUER_CERT: "its certificate's issuer is not the CA the client was given",
  UNABLE_TO_GET_ISSUER_CERT_LOCALLY: "its certificate's issuer is not the CA the client was given",
  SELF_SIGNED_CERT_IN_CHAIN: "its certificate chain ends in a CA the client was not given",
  DEPTH_ZERO_SELF_SIGNED_CERT: "its certificate is self-signed",
  CERT_SIGNATURE_FAILURE: "its certificate's signature does not verify",
  CERT_UNTRUSTED: "its certificate is not trusted",
  CERT_REJECTED: "its certificate was rejected",
  CERT_HAS_EXPIRED: "its certificate has expired",
  CERT_NOT_YET_VALID: "its certificate is not valid yet",
  ERR_TLS_CERT_ALTNAME_INVALID: "its certificate does not name the host dialled (nornctl cert create-node --host)",
  INVALID_CA: "the CA the client was given is not a CA certificate",
};

/** TLS alerts a node sends when it refuses the client certificate. */
const rejectedCert: Record<string, string> = {
  ERR_SSL_TLSV1_ALERT_UNKNOWN_CA: "it is not issued by a CA the node trusts (another cluster's CA?)",
  ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE: "bad certificate: it is not issued by the cluster's CA, or it is malformed",
  ERR_SSL_SSLV3_ALERT_CERTIFICATE_UNKNOWN: "certificate unknown",
  ERR_SSL_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE: "unsupported certificate (not a client certificate?)",
  ERR_SSL_SSLV3_ALERT_CERTIFICATE_REVOKED: "it is revoked",
  ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED: "the node requires one (give tls.cert and tls.key, or a token)",
  ERR_SSL_TLSV1_ALERT_ACCESS_DENIED: "access denied",
  ERR_SSL_TLSV1_ALERT_DECRYPT_ERROR: "its signature does not verify (a key that does not match it?)",
};

const expiredCert: Record<string, string> = {
  ERR_SSL_SSLV3_ALERT_CERTIFICATE_EXPIRED: "it has expired (nornctl cert create-client makes a new one)",
};

/** A transport failure: what it was, and what follows for retries. */
export interface TransportFailure {
  kind: ErrorKind;
  /** Words for the message: "connection refused". */
  reason: string;
  /** The request provably never reached the node: any call may retry. */
  neverSent: boolean;
  /** The node is not usable now: skip it for a while. */
  nodeDown: boolean;
}

/**
 * Classifies err when it is a failure of the transport (no answer of the
 * node): a connection, TLS or HTTP/2 failure. Undefined for an answer of
 * the node (a wire error).
 */
export function transportFailure(err: unknown): TransportFailure | undefined {
  const codes = nodeCodes(err);
  for (const c of codes) {
    if (c in neverSent) return { kind: "unreachable", reason: neverSent[c]!, neverSent: true, nodeDown: true };
  }
  for (const c of codes) {
    if (c in expiredCert) return { kind: "certificate_expired", reason: expiredCert[c]!, neverSent: true, nodeDown: false };
    if (c in rejectedCert) return { kind: "certificate_rejected", reason: rejectedCert[c]!, neverSent: true, nodeDown: false };
    if (c in untrustedNode) return { kind: "untrusted_node", reason: untrustedNode[c]!, neverSent: true, nodeDown: false };
  }
  for (const c of codes) {
    if (c === "ERR_SSL_WRONG_VERSION_NUMBER" || c === "ERR_SSL_PACKET_LENGTH_TOO_LONG") {
      return { kind: "tls", reason: "the node does not speak TLS (use an http:// address without tls, or start the node with -tls-*)", neverSent: true, nodeDown: true };
    }
    if (c.startsWith("ERR_SSL_") || c.startsWith("ERR_TLS_")) {
      return { kind: "tls", reason: `TLS failed (${c})`, neverSent: true, nodeDown: true };
    }
  }
  for (const c of codes) {
    if (c in connectionLost) return { kind: "unreachable", reason: connectionLost[c]!, neverSent: false, nodeDown: true };
  }
  const h2 = err instanceof ConnectError && codes.length === 0 ? /^http\/2 stream closed with error code (\w+)/.exec(err.rawMessage) : null;
  if (h2) {
    if (h2[1] === "REFUSED_STREAM") {
      // The node refused the stream before processing it.
      return { kind: "unavailable", reason: "the node refused the stream", neverSent: true, nodeDown: true };
    }
    if (h2[1] !== "ENHANCE_YOUR_CALM" && h2[1] !== "INADEQUATE_SECURITY" && h2[1] !== "HTTP_1_1_REQUIRED") {
      // A stream the client did not cancel closed under the call (CANCEL:
      // the connection went away, as when the node was killed): the
      // request may or may not have run.
      return { kind: "unreachable", reason: `the connection closed under the call (HTTP/2 ${h2[1]})`, neverSent: false, nodeDown: true };
    }
  }
  if (codes.length > 0 && err instanceof ConnectError && err.code !== Code.DeadlineExceeded && err.code !== Code.Canceled) {
    // Some other Node.js error under the call: the connection failed.
    return { kind: "unreachable", reason: `${codes[0]}: ${innermostMessage(err)}`, neverSent: false, nodeDown: true };
  }
  return undefined;
}

/** What the TLS layer said: OpenSSL's reason ("sslv3 alert bad certificate"), else the innermost message. */
function tlsDetail(err: unknown): string {
  const seen = new Set<unknown>();
  let e: unknown = err;
  let last = "";
  while (e instanceof Error && !seen.has(e)) {
    seen.add(e);
    const r = (e as { reason?: unknown }).reason;
    if (typeof r === "string" && r) return `TLS: ${r}`;
    last = e.message.trim();
    e = (e as { cause?: unknown }).cause;
  }
  return last;
}

/** The message of the deepest error along err's causes. */
function innermostMessage(err: unknown): string {
  let msg = err instanceof Error ? err.message : String(err);
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e instanceof Error && !seen.has(e)) {
    seen.add(e);
    msg = e.message;
    e = (e as { cause?: unknown }).cause;
  }
  return msg;
}

/**
 * A RESOURCE_EXHAUSTED refusal of a request the node had no room for (the
 * call did not run): it carries a google.rpc.RetryInfo detail, or, from a
 * node before those, a message ending "retry later".
 */
export function overBudget(err: unknown): boolean {
  if (!(err instanceof ConnectError) || err.code !== Code.ResourceExhausted) return false;
  return err.details.some((d) => "type" in d && d.type === "google.rpc.RetryInfo") || /retry later\s*$/.test(err.rawMessage);
}

const kindOfCode: Partial<Record<Code, ErrorKind>> = {
  [Code.Unauthenticated]: "unauthenticated",
  [Code.PermissionDenied]: "permission_denied",
  [Code.FailedPrecondition]: "superseded",
  [Code.NotFound]: "not_found",
  [Code.AlreadyExists]: "already_exists",
  [Code.InvalidArgument]: "invalid_argument",
  [Code.Unavailable]: "unavailable",
  [Code.DeadlineExceeded]: "deadline_exceeded",
  [Code.Canceled]: "canceled",
  [Code.ResourceExhausted]: "resource_exhausted",
};

/** Fields whose size the node's payload limit bounds. */
const payloadField = /(^|[.\]\s])(payload|result|data)\b/;

/**
 * Turns the last error of a call into a NornError naming what is wrong.
 * failures holds, for a call that reached no node, why each node tried
 * failed (base URL to reason).
 */
export function toNornError(
  err: unknown,
  method: string,
  node: string | undefined,
  opts: { attempts?: number; ids?: bigint[]; failures?: Map<string, string>; usedToken?: boolean; usedCert?: boolean; certFile?: string } = {},
): NornError {
  if (err instanceof NornError) return err;
  const ce = ConnectError.from(err);
  const base = { method, node, cause: err, attempts: opts.attempts ?? 0, ids: opts.ids ?? [] };
  const where = node ? ` (node ${node})` : "";
  const tf = transportFailure(err);
  if (tf !== undefined) {
    if (tf.kind === "unreachable") {
      const list = opts.failures && opts.failures.size > 0
        ? [...opts.failures].map(([n, r]) => `${n} (${r})`).join(", ")
        : `${node ?? "?"} (${tf.reason})`;
      const what = tf.neverSent ? "no node could be reached" : "the connection to the node failed";
      return new NornError(`norn: ${method}: ${what}: ${list}`, { ...base, kind: "unreachable", code: Code.Unavailable });
    }
    const code = tf.kind === "certificate_rejected" || tf.kind === "certificate_expired" || tf.kind === "untrusted_node" ? Code.Unavailable : ce.code;
    const detail = tlsDetail(err);
    const n = node ?? "?";
    let msg: string;
    switch (tf.kind) {
      case "certificate_rejected":
      case "certificate_expired":
        msg = `node ${n} refused the client certificate${opts.certFile ? ` ${opts.certFile}` : ""}: ${tf.reason}`;
        break;
      case "untrusted_node":
        msg = `node ${n} is not trusted: ${tf.reason} (tls.ca)`;
        break;
      default:
        msg = `node ${n}: ${tf.reason}`;
    }
    return new NornError(`norn: ${method}: ${msg}${detail ? ` [${detail}]` : ""}`, { ...base, kind: tf.kind, code });
  }
  const wf = writeFailureOf(ce);
  let kind: ErrorKind = kindOfCode[ce.code] ?? "other";
  let explain = "";
  switch (ce.code) {
    case Code.Unauthenticated:
      explain = opts.usedToken
        ? "the node does not accept the bearer token: it is unknown or revoked (nornctl token create makes a new one)"
        : opts.usedCert
          ? "the node does not accept the client's credentials"
          : "the node needs credentials: a client certificate (tls.cert, tls.key) or a bearer token (token)";
      break;
    case Code.PermissionDenied:
      explain = "the caller's grants do not allow this call (nornctl grant)";
      break;
    case Code.InvalidArgument:
      if (/exceeds|too (large|long|big)|over (the|its) limit|at most \d/i.test(ce.rawMessage) && payloadField.test(ce.rawMessage)) {
        kind = "payload_too_large";
        explain = "a payload, result or data over the node's limit (-max-payload-bytes, 1 MiB by default)";
      }
      break;
    case Code.ResourceExhausted:
      if (!overBudget(ce) && /request|body|message|larger|too large|exceeds/i.test(ce.rawMessage)) {
        kind = "request_too_large";
        explain = "the request is over the node's request size limit (-max-request-bytes, 4 MiB by default)";
      }
      break;
  }
  const msg = explain ? `${explain}: ${ce.rawMessage}` : ce.rawMessage || Code[ce.code];
  return new NornError(`norn: ${method}: [${codeName(ce.code)}] ${msg}${where}`, { ...base, kind, code: ce.code, writeFailure: wf });
}

/** The code's name as docs/API.md writes it: UNAVAILABLE. */
export function codeName(code: Code): string {
  return (Code[code] ?? String(code)).replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

// --- Handler errors (Worker) ----------------------------------------------

/**
 * A handler error that chooses how the task is aborted: its code,
 * description and args become the abort's TaskError. Throw it from a
 * handler (wrapped in permanent() to abort for good).
 */
export class TaskFailure extends Error {
  override name = "TaskFailure";
  /** lower_snake_case by convention; empty means "handler_error". */
  readonly code: string;
  readonly description: string;
  readonly args: string[];
  constructor(code: string, description = "", args: string[] = []) {
    super(description ? `${code}: ${description}` : code);
    this.code = code;
    this.description = description;
    this.args = args;
  }
}

/**
 * A handler error no retry can fix (a payload that does not parse): the
 * Worker aborts the task for good (ABORTED) instead of failing the attempt
 * for a retry. Make one with permanent(err).
 */
export class PermanentError extends Error {
  override name = "PermanentError";
  constructor(readonly error: unknown) {
    super(error instanceof Error ? error.message : String(error), { cause: error });
  }
}

/** Wraps err so that the Worker aborts the task for good. */
export function permanent(err: unknown): PermanentError {
  return err instanceof PermanentError ? err : new PermanentError(err);
}

/** Whether err is (or wraps) a PermanentError. */
export function isPermanent(err: unknown): boolean {
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e instanceof Error && !seen.has(e)) {
    if (e instanceof PermanentError) return true;
    seen.add(e);
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** Thrown by a handler: give the task back for another claim (Yield). */
export class YieldTask extends Error {
  override name = "YieldTask";
  constructor(message = "yield the task") {
    super(message);
  }
}

/** The reason of a handler's signal when the worker is shutting down. */
export class WorkerShutdown extends Error {
  override name = "WorkerShutdown";
  constructor() {
    super("norn: worker shutting down");
  }
}

/**
 * The reason of a handler's signal when the worker could not renew the
 * lease before it ran out (the nodes were unreachable): another worker may
 * claim the task now.
 */
export class LeaseExpired extends Error {
  override name = "LeaseExpired";
  constructor() {
    super("norn: lease ran out before it could be renewed");
  }
}
