/**
 * The fault-injecting TCP proxy (test/support/fault-proxy.ts): bytes pass unchanged and in
 * order whatever the faults; latency delays a Postgres round trip by at least twice the one-way
 * delay; loss stalls the stream without losing a byte; a partition silences a session without
 * closing it and a heal lets it finish; a new connection made during a partition gets no answer;
 * a cut ends every session. Only `select` statements reach the shared Postgres.
 */
import { randomBytes } from 'node:crypto';
import { createConnection, createServer, type AddressInfo, type Server } from 'node:net';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { FaultProxy } from './support/fault-proxy.js';

let echo: Server;
const proxies: FaultProxy[] = [];
const clients: pg.Client[] = [];

async function startProxy(target: { host: string; port: number }): Promise<FaultProxy> {
  const proxy = await FaultProxy.start({ target, seed: 7 });
  proxies.push(proxy);
  return proxy;
}

function postgresTarget(): { host: string; port: number } {
  const url = new URL(inject('databaseDirectUrl'));
  return { host: url.hostname, port: Number(url.port || 5432) };
}

async function connectThrough(proxy: FaultProxy, options: { connectionTimeoutMillis?: number } = {}): Promise<{ client: pg.Client; ended: Promise<Error> }> {
  const client = new pg.Client({ connectionString: proxy.url(inject('databaseDirectUrl')), ...options });
  clients.push(client);
  const ended = new Promise<Error>((resolve) => client.on('error', resolve));
  await client.connect();
  return { client, ended };
}

/** Sends `payload` through the proxy to the echo server and resolves with what came back. */
function roundTrip(proxy: FaultProxy, payload: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const socket = createConnection(proxy.port, '127.0.0.1');
    const received: Buffer[] = [];
    let length = 0;
    socket.on('data', (chunk) => {
      received.push(chunk);
      length += chunk.length;
      if (length >= payload.length) {
        socket.end();
        resolve(Buffer.concat(received));
      }
    });
    socket.on('error', reject);
    // In pieces, so that many chunks meet the faults.
    for (let offset = 0; offset < payload.length; offset += 16_384) socket.write(payload.subarray(offset, offset + 16_384));
  });
}

beforeAll(async () => {
  echo = createServer((socket) => {
    socket.on('error', () => {});
    socket.pipe(socket);
  });
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
});

afterEach(async () => {
  await Promise.all(clients.splice(0).map((client) => client.end().catch(() => {})));
  await Promise.all(proxies.splice(0).map((proxy) => proxy.close()));
});

afterAll(async () => {
  await new Promise((resolve) => echo.close(resolve));
});

const echoTarget = () => ({ host: '127.0.0.1', port: (echo.address() as AddressInfo).port });

describe('FaultProxy', () => {
  it('passes bytes unchanged and in order, with no fault and under latency, jitter and loss', async () => {
    const proxy = await startProxy(echoTarget());
    const payload = randomBytes(2 * 1024 * 1024);
    expect((await roundTrip(proxy, payload)).equals(payload)).toBe(true);
    proxy.setFaults({ latencyMs: 5, jitterMs: 20, lossRate: 0.2, retransmitMs: 10 });
    expect((await roundTrip(proxy, payload)).equals(payload)).toBe(true);
  });

  it('latency: a Postgres round trip takes at least twice the one-way delay', async () => {
    const proxy = await startProxy(postgresTarget());
    const { client } = await connectThrough(proxy);
    proxy.setFaults({ latencyMs: 150 });
    const began = performance.now();
    expect((await client.query('select 1 as one')).rows).toEqual([{ one: 1 }]);
    expect(performance.now() - began).toBeGreaterThanOrEqual(300);
  });

  it('loss: each lost chunk stalls the stream for the retransmission wait, and nothing is lost', async () => {
    const proxy = await startProxy(postgresTarget());
    const { client } = await connectThrough(proxy);
    proxy.setFaults({ lossRate: 1, retransmitMs: 100 });
    const began = performance.now();
    const { rows } = await client.query(`select string_agg(i::text, ',') as list from generate_series(1, 20000) as i`);
    // The query and its answer each lost once at least: 100 ms, then 200 ms for a second loss in a row.
    expect(performance.now() - began).toBeGreaterThanOrEqual(200);
    expect(rows[0].list.split(',')).toHaveLength(20_000);
    expect(rows[0].list.endsWith(',19999,20000')).toBe(true);
  });

  it('partition: a session hears nothing and is not closed; after the heal its query completes', async () => {
    const proxy = await startProxy(postgresTarget());
    const { client, ended } = await connectThrough(proxy);
    proxy.partition();
    let answered = false;
    const pending = client.query('select 2 as two').then((result) => {
      answered = true;
      return result.rows;
    });
    const closed = await Promise.race([ended.then(() => true), new Promise((resolve) => setTimeout(() => resolve(false), 500))]);
    expect(closed).toBe(false);
    expect(answered).toBe(false);
    expect(proxy.openConnections).toBe(1);
    proxy.heal();
    expect(await pending).toEqual([{ two: 2 }]);
  });

  it('partition: a connection opened meanwhile gets no answer (it times out); one opened after the heal works', async () => {
    const proxy = await startProxy(postgresTarget());
    proxy.partition();
    await expect(connectThrough(proxy, { connectionTimeoutMillis: 500 })).rejects.toThrow(/timeout/i);
    proxy.heal();
    const { client } = await connectThrough(proxy);
    expect((await client.query('select 3 as three')).rows).toEqual([{ three: 3 }]);
  });

  it('cut: every session ends at once; new ones are accepted', async () => {
    const proxy = await startProxy(postgresTarget());
    const sessions = await Promise.all([connectThrough(proxy), connectThrough(proxy)]);
    expect(proxy.cutConnections()).toBe(2);
    for (const session of sessions) expect((await session.ended).message).toMatch(/terminated|ECONNRESET|closed/i);
    const { client } = await connectThrough(proxy);
    expect((await client.query('select 4 as four')).rows).toEqual([{ four: 4 }]);
    expect(proxy.acceptedConnections).toBe(3);
  });
});
