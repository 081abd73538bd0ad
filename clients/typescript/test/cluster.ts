// Test harness: a real Norn cluster with TLS, started by the test from the
// built binaries (bin/nornd and bin/nornctl at the repository root, or
// $NORN_BIN/nornd and $NORN_BIN/nornctl), in a temporary directory, on
// free 127.0.0.1 ports, with the flags scripts/cluster.sh uses. Only the
// processes it started are stopped, by pid, also after failures.

import { spawn, execFile, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, accessSync, constants } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import * as net from "node:net";
import * as dgram from "node:dgram";
import * as https from "node:https";
import { promisify } from "node:util";

const execFileP = promisify(execFile);

/** clients/typescript: the nearest directory above this file with a package.json. */
function findPackageDir(): string {
  let d = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(d, "package.json")) && dirname(d) !== d) d = dirname(d);
  return d;
}
export const packageDir = findPackageDir();
export const repoRoot = resolve(packageDir, "../..");

/** The directory of nornd and nornctl; throws naming what is missing. */
export function binDir(): string {
  const dir = process.env.NORN_BIN ? resolve(process.env.NORN_BIN) : join(repoRoot, "bin");
  for (const b of ["nornd", "nornctl"]) {
    const p = join(dir, b);
    try {
      accessSync(p, constants.X_OK);
    } catch {
      throw new Error(
        `${p} is missing or not executable: build the binaries at the repository root with ` +
          "'go build -o bin/nornd ./cmd/nornd && go build -o bin/nornctl ./cmd/nornctl' (or make build), " +
          "or set NORN_BIN to the directory that holds nornd and nornctl",
      );
    }
  }
  return dir;
}

/** Runs nornctl with args; returns its stdout. */
export async function nornctl(args: string[], env: NodeJS.ProcessEnv = {}): Promise<string> {
  const { stdout } = await execFileP(join(binDir(), "nornctl"), args, { env: { ...process.env, ...env }, timeout: 30_000 });
  return stdout;
}

/** The first port the kernel hands out for outgoing connections (32768 on Linux). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    if (Number.isInteger(low) && low > 0) return low;
  } catch {
    // not Linux
  }
  return 32768;
}

/** Whether port is free on 127.0.0.1 for TCP and UDP (gossip uses both); holds it open until release. */
async function probe(port: number): Promise<{ release: () => Promise<void> } | undefined> {
  const tcp = net.createServer();
  const ok = await new Promise<boolean>((res) => {
    tcp.once("error", () => res(false));
    tcp.listen(port, "127.0.0.1", () => res(true));
  });
  if (!ok) return undefined;
  const udp = dgram.createSocket("udp4");
  const uok = await new Promise<boolean>((res) => {
    udp.once("error", () => res(false));
    udp.bind(port, "127.0.0.1", () => res(true));
  });
  const release = async (): Promise<void> => {
    await new Promise<void>((r) => tcp.close(() => r()));
    if (uok) await new Promise<void>((r) => udp.close(() => r()));
  };
  if (!uok) {
    await release();
    return undefined;
  }
  return { release };
}

/**
 * n distinct free ports on 127.0.0.1 (TCP and UDP), drawn below the
 * kernel's ephemeral range, so that no outgoing connection of another
 * process can take one between this call and the node's bind.
 */
export async function freePorts(n: number): Promise<number[]> {
  const hi = ephemeralLow();
  const lo = hi > 12_000 ? 10_000 : 1024;
  const held: { port: number; release: () => Promise<void> }[] = [];
  try {
    for (let tries = 0; held.length < n; tries++) {
      if (tries > 1000) throw new Error(`no ${n} free ports between ${lo} and ${hi}`);
      const port = lo + Math.floor(Math.random() * (hi - lo));
      if (held.some((h) => h.port === port)) continue;
      const p = await probe(port);
      if (p) held.push({ port, ...p });
    }
  } finally {
    await Promise.all(held.map((h) => h.release()));
  }
  return held.map((h) => h.port);
}

/** The certificates of a test cluster (paths). */
export interface Certs {
  dir: string;
  ca: string;
  caKey: string;
  gossipKey: string;
  clientCert: string;
  clientKey: string;
  node(id: string): { cert: string; key: string };
}

/** Makes a CA, a gossip key, a client certificate "admin" and node certificates n1..nN in dir. */
export async function makeCerts(dir: string, nodes: string[], caName = "Norn test CA"): Promise<Certs> {
  await nornctl(["cert", "create-ca", "--dir", dir, "--name", caName]);
  await Promise.all([
    nornctl(["cert", "create-gossip-key", "--dir", dir]),
    nornctl(["cert", "create-client", "admin", "--dir", dir]),
    ...nodes.map((id) => nornctl(["cert", "create-node", id, "--host", "127.0.0.1,localhost", "--dir", dir])),
  ]);
  return {
    dir,
    ca: join(dir, "ca.crt"),
    caKey: join(dir, "ca.key"),
    gossipKey: join(dir, "gossip.key"),
    clientCert: join(dir, "client-admin.crt"),
    clientKey: join(dir, "client-admin.key"),
    node: (id) => ({ cert: join(dir, `node-${id}.crt`), key: join(dir, `node-${id}.key`) }),
  };
}

/** One nornd process the harness started. */
export interface NodeProc {
  id: string;
  api: string; // host:port
  pid: number;
  log: string;
  proc: ChildProcess;
  exited: boolean;
  /** Killed on purpose (kill9): not an error. */
  killed: boolean;
}

/** Every pid the harness started and has not seen exit: killed on process exit. */
const live = new Map<number, ChildProcess>();
function killLive(): void {
  for (const pid of live.keys()) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
}
process.on("exit", killLive);
// The test process stopped from outside (a CI timeout): take the nodes along.
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
  process.once(sig, () => {
    killLive();
    process.exit(128 + ({ SIGHUP: 1, SIGINT: 2, SIGTERM: 15 } as const)[sig]);
  });
}

export interface ClusterOptions {
  nodes?: number;
  /** More nornd flags for every node. */
  args?: string[];
  /** The access file (nornd -auth-file). */
  authFile?: string;
  /** Reuse certificates (made in the cluster's directory otherwise). */
  certs?: Certs;
  /** A name for the temporary directory. */
  name?: string;
}

/** Flags that keep a test cluster quick on a small machine. */
const quick = [
  "-partitions", "16",
  "-handover-timeout", "0",
  "-lease-grace", "3s",
  "-write-timeout", "2s",
  "-log-level", "warn",
];

/** A running test cluster. */
export class Cluster {
  readonly nodes: NodeProc[] = [];
  private constructor(
    readonly dir: string,
    readonly certs: Certs,
  ) {}

  /** The nodes' API addresses, host:port. */
  addrs(): string[] {
    return this.nodes.map((n) => n.api);
  }

  /**
   * Starts a cluster and waits until every node's /healthz answers. A node
   * that could not bind its port (taken by another process meanwhile)
   * makes it start again on other ports, up to 3 times.
   */
  static async start(opts: ClusterOptions = {}): Promise<Cluster> {
    const n = opts.nodes ?? 3;
    const bin = join(binDir(), "nornd");
    const ids = Array.from({ length: n }, (_, i) => `n${i + 1}`);
    for (let attempt = 1; ; attempt++) {
      const dir = mkdtempSync(join(tmpdir(), `norn-ts-${opts.name ?? "cluster"}-`));
      const certs = opts.certs ?? (await makeCerts(join(dir, "certs"), ids));
      const c = new Cluster(dir, certs);
      try {
        await c.spawnNodes(bin, ids, opts);
        await c.waitHealthy(60_000);
        return c;
      } catch (e) {
        const inUse = c.nodes.some((nd) => existsSync(nd.log) && /address already in use/.test(readFileSync(nd.log, "utf8")));
        await c.stop();
        if (!inUse || attempt >= 3) throw e;
      }
    }
  }

  private async spawnNodes(bin: string, ids: string[], opts: ClusterOptions): Promise<void> {
    const n = ids.length;
    const { dir, certs } = this;
    const ports = await freePorts(3 * n);
    const gossip = ids.map((_, i) => `127.0.0.1:${ports[3 * i + 2]}`);
    for (const [i, id] of ids.entries()) {
      const api = `127.0.0.1:${ports[3 * i]}`;
      const nc = certs.node(id);
      const args = [
        "-node-id", id,
        "-machine-id", String(i + 1),
        "-data-dir", join(dir, `node${i + 1}`),
        "-listen", api,
        "-raft-addr", `127.0.0.1:${ports[3 * i + 1]}`,
        "-gossip-addr", gossip[i]!,
        "-bootstrap-expect", String(n),
        ...(n > 1 ? ["-join", gossip.filter((_, j) => j !== i).join(",")] : []),
        "-tls-ca", certs.ca,
        "-tls-cert", nc.cert,
        "-tls-key", nc.key,
        "-gossip-key", certs.gossipKey,
        ...quick,
        ...(opts.authFile ? ["-auth-file", opts.authFile] : []),
        ...(opts.args ?? []),
      ];
      const log = join(dir, `node${i + 1}.log`);
      const fd = openSync(log, "a");
      const proc = spawn(bin, args, { stdio: ["ignore", fd, fd] });
      closeSync(fd);
      if (proc.pid === undefined) throw new Error(`could not start ${bin}`);
      const node: NodeProc = { id, api, pid: proc.pid, log, proc, exited: false, killed: false };
      live.set(proc.pid, proc);
      proc.on("exit", () => {
        node.exited = true;
        live.delete(node.pid);
      });
      this.nodes.push(node);
    }
  }

  /** GET /healthz of one node over TLS with the admin certificate. */
  private healthz(api: string): Promise<boolean> {
    return new Promise((ok) => {
      const req = https.get(
        `https://${api}/healthz`,
        {
          ca: readFileSync(this.certs.ca),
          cert: readFileSync(this.certs.clientCert),
          key: readFileSync(this.certs.clientKey),
          timeout: 2000,
          agent: false,
        },
        (res) => {
          res.resume();
          ok(res.statusCode === 200);
        },
      );
      req.on("error", () => ok(false));
      req.on("timeout", () => req.destroy());
    });
  }

  async waitHealthy(timeoutMs: number): Promise<void> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const live = this.nodes.filter((n) => !n.exited);
      for (const n of this.nodes) {
        if (n.exited && !n.killed) throw new Error(`nornd ${n.id} exited; last lines of ${n.log}:\n${tail(n.log)}`);
      }
      const ok = await Promise.all(live.map((n) => this.healthz(n.api)));
      if (ok.every(Boolean)) return;
      if (Date.now() > until) throw new Error(`the cluster in ${this.dir} did not become healthy within ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  /** kill -9 of one node (by its pid). */
  async kill9(id: string): Promise<void> {
    const n = this.nodes.find((x) => x.id === id);
    if (!n || n.exited) return;
    n.killed = true;
    const exited = new Promise<void>((ok) => (n.exited ? ok() : n.proc.once("exit", () => ok())));
    process.kill(n.pid, "SIGKILL");
    await exited;
  }

  /** Sends a signal to one node (SIGHUP: reload the access file). */
  signal(id: string, sig: NodeJS.Signals): void {
    const n = this.nodes.find((x) => x.id === id);
    if (n && !n.exited) process.kill(n.pid, sig);
  }

  /**
   * Stops exactly the processes this cluster started: SIGTERM, then SIGKILL
   * after 5 s; removes the directory unless NORN_KEEP is set.
   */
  async stop(): Promise<void> {
    await Promise.all(
      this.nodes.map(async (n) => {
        if (n.exited) return;
        const exited = new Promise<void>((ok) => (n.exited ? ok() : n.proc.once("exit", () => ok())));
        try {
          process.kill(n.pid, "SIGTERM");
        } catch {
          return;
        }
        const t = setTimeout(() => {
          try {
            process.kill(n.pid, "SIGKILL");
          } catch {
            // gone
          }
        }, 5000);
        await exited;
        clearTimeout(t);
      }),
    );
    if (!process.env.NORN_KEEP) rmSync(this.dir, { recursive: true, force: true });
  }
}

function tail(file: string, lines = 20): string {
  if (!existsSync(file)) return "(no log)";
  return readFileSync(file, "utf8").split("\n").slice(-lines).join("\n");
}
