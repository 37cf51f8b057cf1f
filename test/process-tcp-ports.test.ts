/**
 * The local TCP ports of a process (bench/support/process-tcp-ports.ts), by which the benchmark
 * finds the Postgres backends serving a worker: the /proc table's format, and a real socket of
 * this process found among its ports.
 */
import { once } from 'node:events';
import { createConnection, createServer, type AddressInfo, type Socket } from 'node:net';
import { expect, it } from 'vitest';
import { parseTcpTable, tcpLocalPortsOf } from '../bench/support/process-tcp-ports.js';

it('parses /proc/net/tcp rows into each socket inode and its local port (hex)', () => {
  const table = [
    '  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode',
    '   0: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   105        0 21411 1 0000000000000000 100 0 0 10 0',
    '   1: 0100007F:D3A2 0100007F:1538 01 00000000:00000000 00:00000000 00000000     0        0 987654 1 0000000000000000 20 4 30 10 -1',
    '   2: 0100007F:9C40 0100007F:1538 06 00000000:00000000 03:00000C3E 00000000     0        0 0 3 0000000000000000',
    '',
  ].join('\n');
  expect(parseTcpTable(table)).toEqual(
    new Map([
      [21411, 5432],
      [987654, 0xd3a2],
    ]),
  );
});

it("finds a connected socket's local port among this process's ports, and nothing for a process that is gone", async () => {
  const server = createServer((socket) => socket.end());
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  let client: Socket | undefined;
  try {
    client = createConnection((server.address() as AddressInfo).port, '127.0.0.1');
    await once(client, 'connect');
    expect(tcpLocalPortsOf(process.pid)).toContain(client.localPort);
    expect(tcpLocalPortsOf(2 ** 31 - 1).size).toBe(0);
  } finally {
    client?.destroy();
    server.close();
  }
});
