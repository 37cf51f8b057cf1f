/**
 * A Postgres high-availability cluster of the caller's own, built as production Patroni set-ups
 * are: a one-member etcd holds the leader lock, each member is a Patroni managing a Postgres
 * server (the machine's own binaries, a data directory of its own), and an HAProxy routes
 * clients to whichever member Patroni's REST API calls the primary (`/primary`), and a second
 * port to the standbys (`/replica`), the "reader endpoint". Everything lives in one temporary
 * directory, on spare ports of 127.0.0.1; the machine's own Postgres is never touched.
 *
 * Replication is synchronous by default (`synchronous_mode: true`: a commit is acknowledged once
 * the synchronous standby has it, so a failover loses nothing acknowledged), or asynchronous
 * (`synchronous: false`: a commit is acknowledged by the primary alone, and a failover can lose
 * it). The nemesis operations are what production sees: the leader's Postgres killed (Patroni
 * restarts it in place), a member crashed (Patroni and Postgres killed: a failover once the
 * leader lock expires), a planned switchover, a manual failover, and a standby's replication
 * frozen, so that commits the primary acknowledged are missing on it.
 *
 * Binaries: `PATRONI` (else `patroni`: Debian's `patroni`), `ETCD` (`etcd-server`), `HAPROXY`
 * (`haproxy`) and Postgres's from `PG_BINDIR`, else `pg_config --bindir`, else the newest
 * `/usr/lib/postgresql/<n>/bin`. As root, Patroni and Postgres run as the `postgres` OS user
 * (`PG_OS_USER`).
 *
 * @example
 * const cluster = await PatroniCluster.start();
 * try {
 *   // write through cluster.url; then
 *   const { from, to } = await cluster.switchover();
 * } finally {
 *   await cluster.stop();
 * }
 */
import { chownSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { stringify } from 'yaml';
import { findBinDir } from '../chaos/private-postgres.js';
import { Daemon, childPids, freePorts, killOnExit, postgresOsUser, processExists, signalProcess, waitUntil, type OsUser } from './daemon.js';
import { HaProxy } from './haproxy.js';
import { PrivateEtcd } from './private-etcd.js';
import { findSystemTool, missingToolLine } from './system-tools.js';

/** Options of {@link PatroniCluster.start}. */
export interface PatroniClusterOptions {
  /** `synchronous_mode`: commits wait for a synchronous standby. @defaultValue `true` */
  readonly synchronous?: boolean;
  /** How many members (Patroni + Postgres). @defaultValue `2` */
  readonly members?: number;
  /**
   * The leader lock's time to live: how long after the leader's Patroni stops renewing it (a
   * crashed member) a standby takes over. Patroni requires `loop_wait + 2 × retry_timeout ≤ ttl`.
   * @defaultValue `10`
   */
  readonly ttlSeconds?: number;
  /** Seconds between Patroni's checks of its member. @defaultValue `1` */
  readonly loopWaitSeconds?: number;
  /** How long Patroni retries etcd and Postgres before it gives up on an operation. @defaultValue `3` */
  readonly retryTimeoutSeconds?: number;
  /** `max_connections` of every member. @defaultValue `100` */
  readonly maxConnections?: number;
  /** More Postgres settings for every member (bootstrap configuration, stored in etcd). */
  readonly parameters?: Readonly<Record<string, string | number>>;
  /**
   * How long {@link PatroniCluster.start} waits for a healthy cluster, per attempt: a cluster
   * not healthy by then is stopped, its members' log tails printed, and started once more
   * afresh. @defaultValue `75000`
   */
  readonly startTimeoutMs?: number;
}

/** A member as Patroni's `/cluster` reports it. */
export interface PatroniMemberStatus {
  readonly name: string;
  /** `leader`, `sync_standby` or `replica`. */
  readonly role: string;
  /** `running`, `starting`, `stopped`, `crashed`, `creating replica`, … */
  readonly state: string;
  readonly timeline?: number;
  /** A standby's lag behind the leader in bytes (absent on the leader; `'unknown'` while unknown). */
  readonly lag?: number | string;
}

/** What a switchover or failover did, and how long it took until the new leader served writes. */
export interface LeaderChange {
  readonly from: string | undefined;
  readonly to: string;
  readonly ms: number;
}

interface Member {
  readonly name: string;
  readonly pgPort: number;
  readonly restPort: number;
  readonly dataDir: string;
  readonly configFile: string;
  patroni: Daemon | undefined;
}

/** A running private Patroni cluster behind an HAProxy. */
export class PatroniCluster {
  /** The temporary directory: etcd's data, each member's configuration, data and logs, HAProxy's configuration. */
  readonly dir: string;
  readonly synchronous: boolean;
  readonly #members: Member[];
  readonly #user: OsUser | undefined;
  readonly #patroni: string;
  #etcd: PrivateEtcd | undefined;
  #haproxy: HaProxy | undefined;
  #forgetExitCleanup: () => void = () => {};
  /** Standby name → the pid of the leader's WAL sender to it, frozen by pauseReplication. */
  readonly #pausedWalSenders = new Map<string, number>();

  private constructor(dir: string, synchronous: boolean, members: Member[], user: OsUser | undefined, patroni: string) {
    this.dir = dir;
    this.synchronous = synchronous;
    this.#members = members;
    this.#user = user;
    this.#patroni = patroni;
  }

  /**
   * Starts etcd, every member and HAProxy, and waits until a leader serves writes and every
   * standby streams. A bootstrap that does not get there in `startTimeoutMs` (on a loaded
   * machine a member's Postgres can fail to start, e.g. when its port was taken meanwhile) is
   * stopped and printed, and the cluster started once more on fresh ports: what the tests
   * exercise is the cluster's behaviour, not its first bootstrap.
   */
  static async start(options: PatroniClusterOptions = {}): Promise<PatroniCluster> {
    // A missing binary is no bootstrap failure: another attempt could not mend it.
    const patroni = findSystemTool('patroni');
    if (patroni === undefined) throw new Error(`no patroni binary: ${missingToolLine('patroni')}`);
    try {
      return await PatroniCluster.#startOnce(patroni, options);
    } catch (error) {
      console.warn(`[patroni] the cluster did not start; starting it once more on fresh ports. ${(error as Error).message}`);
      return PatroniCluster.#startOnce(patroni, options);
    }
  }

  /** Hook timeout for a test set-up that calls {@link PatroniCluster.start}: both attempts and their clean-up. */
  static readonly START_HOOK_TIMEOUT_MS = 200_000;

  static async #startOnce(patroni: string, options: PatroniClusterOptions): Promise<PatroniCluster> {
    const binDir = findBinDir();
    const user = postgresOsUser();
    const dir = mkdtempSync(join(tmpdir(), 'ij-patroni-'));
    const count = options.members ?? 2;
    const ports = await freePorts(count * 2);
    const members: Member[] = Array.from({ length: count }, (_, i) => ({
      name: `pg${i + 1}`,
      pgPort: ports[i * 2]!,
      restPort: ports[i * 2 + 1]!,
      dataDir: join(dir, `pg${i + 1}`, 'data'),
      configFile: join(dir, `pg${i + 1}`, 'patroni.yml'),
      patroni: undefined,
    }));
    const cluster = new PatroniCluster(dir, options.synchronous ?? true, members, user, patroni);
    // Postgres runs outside Patroni's process group: a process that dies before stop() must
    // not leave servers behind (the daemons see to themselves).
    cluster.#forgetExitCleanup = killOnExit(() => members.forEach((member) => killPostgres(member.dataDir)));
    try {
      cluster.#etcd = await PrivateEtcd.start(join(dir, 'etcd'));
      for (const member of members) {
        mkdirSync(join(dir, member.name));
        writeFileSync(member.configFile, stringify(patroniConfig(member, { ...options, dir, binDir, etcdHost: cluster.#etcd.host })));
        if (user) chownSync(join(dir, member.name), user.uid, user.gid);
        if (user) chownSync(member.configFile, user.uid, user.gid);
      }
      if (user) chownSync(dir, user.uid, user.gid);
      cluster.#haproxy = await HaProxy.start({
        dir,
        listeners: [
          { name: 'primary', checkPath: '/primary', servers: members.map((m) => ({ name: m.name, port: m.pgPort, checkPort: m.restPort })) },
          { name: 'replicas', checkPath: '/replica', servers: members.map((m) => ({ name: m.name, port: m.pgPort, checkPort: m.restPort })) },
        ],
      });
      // Started together: the member that takes etcd's initialize key bootstraps the cluster
      // (initdb); the others wait for it and clone it with pg_basebackup.
      await Promise.all(members.map((member) => cluster.#startPatroni(member)));
      await cluster.waitForHealthy(options.startTimeoutMs ?? 75_000);
      return cluster;
    } catch (error) {
      const logs = members.map((m) => `--- ${m.name}:\n${cluster.patroniLogTail(m.name, 1_500)}`).join('\n');
      await cluster.stop();
      throw new Error(`${(error as Error).message}\n${logs}`);
    }
  }

  /** The leader, through HAProxy: `postgres://postgres@127.0.0.1:<port>/postgres`. */
  get url(): string {
    return `postgres://postgres@127.0.0.1:${this.#haproxy!.port('primary')}/postgres`;
  }

  /** A running standby, through HAProxy: a reader endpoint. */
  get replicaUrl(): string {
    return `postgres://postgres@127.0.0.1:${this.#haproxy!.port('replicas')}/postgres`;
  }

  /** The members' names (`pg1`, `pg2`, …). */
  get memberNames(): string[] {
    return this.#members.map((m) => m.name);
  }

  /** One member's Postgres itself, whatever its role: what a URL pinned to one host reaches after a failover. */
  memberUrl(name: string): string {
    return `postgres://postgres@127.0.0.1:${this.#member(name).pgPort}/postgres`;
  }

  /** The members as Patroni reports them (`GET /cluster` of a live member). */
  async members(): Promise<PatroniMemberStatus[]> {
    let lastError: unknown;
    for (const member of this.#members.filter((m) => m.patroni?.running)) {
      try {
        const response = await fetch(`http://127.0.0.1:${member.restPort}/cluster`, { signal: AbortSignal.timeout(2_000) });
        const body = (await response.json()) as { members: PatroniMemberStatus[] };
        return body.members.map(({ name, role, state, timeline, lag }) => ({ name, role, state, ...(timeline !== undefined ? { timeline } : {}), ...(lag !== undefined ? { lag } : {}) }));
      } catch (error) {
        lastError = error;
      }
    }
    throw new Error(`no Patroni member answered GET /cluster${lastError instanceof Error ? `: ${lastError.message}` : ''}`);
  }

  /** The member holding the leader lock with its Postgres running, if any. */
  async leader(): Promise<string | undefined> {
    const members = await this.members();
    return members.find((m) => m.role === 'leader' && m.state === 'running')?.name;
  }

  /**
   * Waits until a leader (other than `notMember`, when given) holds the lock, its Postgres,
   * reached directly, is out of recovery and takes writes, and HAProxy routes a new connection
   * on {@link url} to it. Returns its name.
   *
   * The last condition matters after a crash: Patroni names the new leader before HAProxy's
   * health check has marked it up, and until then HAProxy closes a new connection at once (the
   * crashed member being down too), which a client sees as "Connection terminated unexpectedly".
   */
  async waitForLeader(options: { readonly notMember?: string; readonly timeoutMs?: number } = {}): Promise<string> {
    const deadline = Date.now() + (options.timeoutMs ?? 60_000);
    const leader = await waitUntil(
      `a Patroni leader${options.notMember ? ` other than ${options.notMember}` : ''}`,
      async () => {
        const leader = await this.leader();
        if (leader === undefined || leader === options.notMember) return undefined;
        return (await inRecovery(this.memberUrl(leader))) ? undefined : leader;
      },
      options.timeoutMs ?? 60_000,
      200,
    );
    await waitUntil(
      `HAProxy routing to the leader ${leader}`,
      async () => ((await routedPort(this.url)) === this.#member(leader).pgPort ? true : undefined),
      Math.max(1, deadline - Date.now()),
      100,
    );
    return leader;
  }

  /**
   * Waits until the cluster is whole: a leader taking writes, every member running, every
   * standby streaming from it (with synchronous replication, one of them the synchronous
   * standby), and HAProxy routing a new connection to the leader.
   */
  async waitForHealthy(timeoutMs = 60_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    await this.waitForLeader({ timeoutMs });
    await waitUntil(
      'every Patroni member running and streaming',
      async () => {
        const members = await this.members();
        if (members.length !== this.#members.length || members.some((m) => m.state !== 'running')) return undefined;
        const standbys = members.filter((m) => m.role !== 'leader');
        if (this.synchronous && !standbys.some((m) => m.role === 'sync_standby')) return undefined;
        const leader = members.find((m) => m.role === 'leader');
        if (!leader) return undefined;
        const streaming = await queryOne<{ n: string }>(this.memberUrl(leader.name), `select count(*) as n from pg_stat_replication where state = 'streaming'`);
        return Number(streaming.n) === standbys.length ? true : undefined;
      },
      Math.max(1, deadline - Date.now()),
      200,
    );
  }

  /**
   * SIGKILL of the leader's Postgres: the postmaster and every backend at once. Patroni, still
   * alive and holding the lock, finds it dead and starts it again in place (crash recovery, as
   * a standby first, then promoted: a new timeline); no other member takes over unless that
   * fails. Returns the leader's name.
   */
  async killLeaderPostgres(): Promise<string> {
    const leader = await this.waitForLeader();
    killPostgres(this.#member(leader).dataDir);
    return leader;
  }

  /**
   * Crashes a member, as a machine dies: SIGKILL of its Patroni and of its Postgres. When it
   * was the leader, a standby takes over once the lock's TTL has run out.
   */
  async crashMember(name: string): Promise<void> {
    const member = this.#member(name);
    await member.patroni?.kill();
    member.patroni = undefined;
    killPostgres(member.dataDir);
  }

  /** Crashes the current leader ({@link crashMember}); returns its name. */
  async crashLeader(): Promise<string> {
    const leader = await this.waitForLeader();
    await this.crashMember(leader);
    return leader;
  }

  /**
   * Starts a crashed member's Patroni again: it rejoins as a standby of the current leader
   * (rewinding its data directory with pg_rewind when it had diverged).
   */
  async restartMember(name: string): Promise<void> {
    const member = this.#member(name);
    if (member.patroni?.running) throw new Error(`member ${name} is running`);
    killPostgres(member.dataDir);
    await this.#startPatroni(member);
  }

  /**
   * A planned switchover (`POST /switchover`): the leader shuts its Postgres down (sessions end
   * with 57P01), the candidate (else the synchronous standby, else any standby) is promoted,
   * the old leader rejoins as its standby. Resolves once the new leader takes writes.
   */
  async switchover(candidate?: string): Promise<LeaderChange> {
    const from = await this.waitForLeader();
    const to = candidate ?? (await this.#standbyToPromote());
    const began = Date.now();
    await this.#post(from, '/switchover', { leader: from, candidate: to });
    await this.waitForLeader({ notMember: from });
    return { from, to, ms: Date.now() - began };
  }

  /**
   * A manual failover (`POST /failover`) to `candidate` (else the synchronous standby, else any
   * standby), whether the leader is healthy or not. Resolves once the new leader takes writes.
   */
  async failover(candidate?: string): Promise<LeaderChange> {
    const from = await this.leader();
    const to = candidate ?? (await this.#standbyToPromote());
    const began = Date.now();
    const asked = this.#members.find((m) => m.patroni?.running && m.name !== from) ?? this.#member(to);
    await this.#post(asked.name, '/failover', { candidate: to });
    const leader = await this.waitForLeader(from ? { notMember: from } : {});
    return { from, to: leader, ms: Date.now() - began };
  }

  /**
   * Freezes the leader's WAL sender to standby `name` (SIGSTOP): the connection stays up, but
   * the leader sends it nothing more. With asynchronous replication the leader goes on
   * acknowledging commits that only it has, which a failover then loses; with synchronous
   * replication commits wait for the standby instead. (Freezing the standby's WAL receiver
   * would not do: what the leader already sent waits in the socket's buffers and arrives.)
   */
  async pauseReplication(name: string): Promise<void> {
    const leader = await this.waitForLeader();
    const row = await queryOne<{ pid: number | null }>(this.memberUrl(leader), {
      text: 'select (select pid from pg_stat_replication where application_name = $1) as pid',
      values: [name],
    });
    if (row.pid === null) throw new Error(`the leader ${leader} has no WAL sender to ${name} (is it a streaming standby?)`);
    this.#pausedWalSenders.set(name, row.pid);
    signalProcess(row.pid, 'SIGSTOP');
  }

  /** Wakes a WAL sender frozen by {@link pauseReplication} (if its server still runs). */
  resumeReplication(name: string): void {
    const pid = this.#pausedWalSenders.get(name);
    this.#pausedWalSenders.delete(name);
    if (pid !== undefined) signalProcess(pid, 'SIGCONT');
  }

  /** The tail of a member's Patroni log, for diagnostics. */
  patroniLogTail(name: string, chars = 4_000): string {
    try {
      return readFileSync(join(this.dir, name, 'patroni.log'), 'utf8').slice(-chars);
    } catch {
      return '';
    }
  }

  /** Kills everything (SIGKILL: HAProxy, every Patroni and Postgres, etcd) and deletes the directory. */
  async stop(): Promise<void> {
    await this.#haproxy?.stop();
    for (const member of this.#members) {
      await member.patroni?.kill();
      member.patroni = undefined;
    }
    // A Patroni killed while it was starting a server or cloning one leaves that process behind.
    for (const member of this.#members) killPostgres(member.dataDir);
    await waitUntil('the private Postgres servers to exit', async () => (this.#members.some((m) => postgresPids(m.dataDir).length > 0) ? undefined : true), 15_000, 50).catch(
      () => {},
    );
    await this.#etcd?.stop();
    this.#forgetExitCleanup();
    rmSync(this.dir, { recursive: true, force: true });
  }

  async #startPatroni(member: Member): Promise<void> {
    member.patroni = await Daemon.start({
      label: `patroni ${member.name}`,
      binary: this.#patroni,
      args: [member.configFile],
      logFile: join(this.dir, member.name, 'patroni.out'),
      user: this.#user,
      home: join(this.dir, member.name),
    });
  }

  async #standbyToPromote(): Promise<string> {
    const members = await this.members();
    const standby = members.find((m) => m.role === 'sync_standby' && m.state === 'running') ?? members.find((m) => m.role === 'replica' && m.state === 'running');
    if (!standby) throw new Error(`no running standby to promote: ${JSON.stringify(members)}`);
    return standby.name;
  }

  async #post(memberName: string, path: string, body: unknown): Promise<void> {
    const member = this.#member(memberName);
    const response = await fetch(`http://127.0.0.1:${member.restPort}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(60_000),
    });
    const text = await response.text();
    if (!response.ok) throw new Error(`POST ${path} to ${memberName} answered ${response.status}: ${text}`);
  }

  #member(name: string): Member {
    const member = this.#members.find((m) => m.name === name);
    if (!member) throw new Error(`no member ${name} (members: ${this.memberNames.join(', ')})`);
    return member;
  }
}

/** A member's `patroni.yml`. */
function patroniConfig(
  member: Member,
  options: PatroniClusterOptions & { readonly dir: string; readonly binDir: string; readonly etcdHost: string },
): Record<string, unknown> {
  const memberDir = join(options.dir, member.name);
  return {
    scope: 'ij-patroni',
    name: member.name,
    log: { level: 'INFO', dir: memberDir, file_num: 1, file_size: 50_000_000 },
    restapi: { listen: `127.0.0.1:${member.restPort}`, connect_address: `127.0.0.1:${member.restPort}` },
    etcd3: { hosts: [options.etcdHost] },
    bootstrap: {
      // The cluster-wide settings, written to etcd by the member that bootstraps.
      dcs: {
        ttl: options.ttlSeconds ?? 10,
        loop_wait: options.loopWaitSeconds ?? 1,
        retry_timeout: options.retryTimeoutSeconds ?? 3,
        // A standby further behind than this is not promoted by a failover.
        maximum_lag_on_failover: 1_048_576,
        synchronous_mode: options.synchronous ?? true,
        postgresql: {
          // A crashed leader that had diverged rejoins by rewinding, not by a new base backup.
          use_pg_rewind: true,
          use_slots: true,
          parameters: {
            max_connections: options.maxConnections ?? 100,
            wal_log_hints: 'on',
            wal_keep_size: '128MB',
            // Durable, as production is (Patroni's own defaults are the same; stated here).
            fsync: 'on',
            full_page_writes: 'on',
            synchronous_commit: 'on',
            ...options.parameters,
          },
        },
      },
      // --no-sync: the new cluster holds nothing yet; the server itself runs with fsync on.
      initdb: [{ encoding: 'UTF8' }, 'no-locale', { auth: 'trust' }, 'no-sync'],
      pg_hba: ['local all all trust', 'host all all 127.0.0.1/32 trust', 'host replication all 127.0.0.1/32 trust'],
    },
    postgresql: {
      listen: `127.0.0.1:${member.pgPort}`,
      connect_address: `127.0.0.1:${member.pgPort}`,
      data_dir: member.dataDir,
      bin_dir: options.binDir,
      pgpass: join(memberDir, 'pgpass'),
      authentication: { superuser: { username: 'postgres' }, replication: { username: 'postgres' }, rewind: { username: 'postgres' } },
      parameters: {
        unix_socket_directories: memberDir,
        logging_collector: 'on',
        log_directory: memberDir,
        log_filename: 'postgres.log',
        log_rotation_size: 0,
      },
    },
    // No watchdog device in a test machine; Patroni would only warn.
    watchdog: { mode: 'off' },
  };
}

/** Pids of a member's Postgres (the postmaster named with `-D <dataDir>`, its children) and of any pg_basebackup or pg_rewind into that directory. */
function postgresPids(dataDir: string): number[] {
  const owners: number[] = [];
  for (const pid of allPids()) {
    try {
      const args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      if (args.includes(dataDir) || args.some((arg) => arg === `--pgdata=${dataDir}` || arg === `--target-pgdata=${dataDir}`)) owners.push(pid);
    } catch {
      // exited meanwhile
    }
  }
  return [...new Set(owners.flatMap((pid) => [pid, ...childPids(pid)]))].filter(processExists);
}

/** SIGKILL to every process of a member's Postgres at once (listed first: killed children are re-parented). */
function killPostgres(dataDir: string): void {
  for (const pid of postgresPids(dataDir)) signalProcess(pid, 'SIGKILL');
}

function allPids(): number[] {
  return readdirSync('/proc')
    .filter((entry) => /^\d+$/.test(entry))
    .map(Number);
}

async function inRecovery(url: string): Promise<boolean> {
  const row = await queryOne<{ recovery: boolean }>(url, 'select pg_is_in_recovery() as recovery');
  return row.recovery;
}

/** The port of the Postgres a new connection to `url` reaches (through HAProxy: the server it chose). */
async function routedPort(url: string): Promise<number> {
  const row = await queryOne<{ port: number }>(url, 'select inet_server_port() as port');
  return row.port;
}

/** One row of a query on a short-lived connection. */
async function queryOne<T>(url: string, query: string | pg.QueryConfig): Promise<T> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2_000 });
  client.on('error', () => {});
  try {
    await client.connect();
    return (await client.query(query)).rows[0] as T;
  } finally {
    await client.end().catch(() => {});
  }
}
