// Norn's TypeScript client: the generated messages and services of
// api/norn/v1 (protobuf-es v2, connect-es v2), and a hand-written layer
// like the Go client's: Client (fail-over, retries, TLS, tokens), Worker,
// and errors that name what is wrong.

export {
  Client,
  Endpoints,
  loadTls,
  tlsFromEnv,
  parseAddr,
  parseSeeds,
  backoffMs,
  endpointBackoffMs,
  DEFAULT_TIMEOUT_MS,
  DEFAULT_DISCOVERY_INTERVAL_MS,
} from "./client.js";
export type {
  ClientOptions,
  ClientRetryPolicy,
  CallOptions,
  ClaimOptions,
  EnqueueOptions,
  EnqueueResult,
  Endpoint,
  TaskErrorInit,
  TaskSpecInit,
  TlsOptions,
} from "./client.js";
export { Worker, WorkerTask, CODE_HANDLER_ERROR, abortError } from "./worker.js";
export type { Handler, Logger, WorkerOptions } from "./worker.js";
export {
  Code,
  ConnectError,
  NornError,
  TaskFailure,
  PermanentError,
  YieldTask,
  WorkerShutdown,
  LeaseExpired,
  permanent,
  isPermanent,
  isSuperseded,
  isNotFound,
  isUnavailable,
  writeFailureOf,
  codeOf,
  codeName,
} from "./errors.js";
export type { ErrorKind, NornErrorInit } from "./errors.js";

// The generated API (messages, enums, service descriptors).
export * from "./gen/norn/v1/task_pb.js";
export * from "./gen/norn/v1/task_service_pb.js";
export * from "./gen/norn/v1/error_details_pb.js";
export * from "./gen/norn/v1/admin_service_pb.js";
export * from "./gen/norn/v1/queue_service_pb.js";
export * from "./gen/norn/v1/schedule_pb.js";
