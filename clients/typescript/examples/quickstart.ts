// The README's quickstart, compiled with the package (npm run build) so
// that it stays correct. Against `make cluster` (TLS, certificates under
// data/certs), from the repository root after `. data/certs/env`:
//
//   node clients/typescript/dist/examples/quickstart.js

import { Client, Worker, NornError, TaskStatus, permanent, tlsFromEnv, loadTls } from "../src/index.js";

// NORN_CA, NORN_CERT, NORN_KEY (`. data/certs/env`), or the files themselves.
const tls = tlsFromEnv() ?? loadTls({
  caFile: "data/certs/ca.crt",
  certFile: "data/certs/client-admin.crt",
  keyFile: "data/certs/client-admin.key",
});
const client = new Client(process.env.NORN_ADDR ?? "127.0.0.1:7400,127.0.0.1:7410,127.0.0.1:7420", { tls });

// Producer: enqueue a task.
const id = await client.enqueue({ queue: "emails", payload: JSON.stringify({ to: "ada@example.com" }), priority: 5 });
console.log("enqueued", id);

// Worker: claims, renews while the handler runs, completes with its result.
const worker = new Worker(client, {
  queue: "emails",
  concurrency: 4,
  handler: async (task) => {
    let msg: { to?: string };
    try {
      msg = JSON.parse(task.text());
    } catch (e) {
      throw permanent(e); // no retry can fix it: ABORTED
    }
    if (!msg.to) throw new Error("no recipient"); // a failed attempt: retried after its backoff
    // ... send it, honouring task.signal ...
    return `sent to ${msg.to}`; // the task's result
  },
});
const running = worker.run(); // until SIGINT/SIGTERM or worker.stop()

// Wait for the task, then stop.
for (;;) {
  const t = await client.getTask(id);
  if (t.status === TaskStatus.COMPLETED) {
    console.log("result:", new TextDecoder().decode(t.result));
    break;
  }
  await new Promise((r) => setTimeout(r, 200));
}
await worker.stop();
await running;

try {
  await client.enqueue({ queue: "emails", payload: new Uint8Array(2 << 20) });
} catch (e) {
  if (e instanceof NornError) console.log(e.kind, "-", e.message); // payload_too_large - norn: enqueue: ...
}
client.close();
