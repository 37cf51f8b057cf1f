/**
 * The local TCP ports of a process's open sockets, from Linux's /proc: its file descriptors name
 * socket inodes (`socket:[<inode>]`), and `/proc/<pid>/net/tcp` and `tcp6` give each inode's
 * local address. A Postgres backend's `pg_stat_activity.client_port` is such a port, which is how
 * the benchmark finds the backends serving one worker process and no one else's.
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';

/** Local ports of `pid`'s TCP sockets (IPv4 and IPv6); empty if the process is gone or not ours to read. */
export function tcpLocalPortsOf(pid: number): Set<number> {
  const inodes = socketInodesOf(pid);
  const ports = new Set<number>();
  if (inodes.size === 0) return ports;
  for (const table of ['tcp', 'tcp6']) {
    let text: string;
    try {
      text = readFileSync(`/proc/${pid}/net/${table}`, 'utf8');
    } catch {
      continue;
    }
    for (const [inode, port] of parseTcpTable(text)) if (inodes.has(inode)) ports.add(port);
  }
  return ports;
}

/**
 * Parses `/proc/net/tcp` or `tcp6`: each socket's inode and local port. A row is
 * `sl local_address rem_address st … uid timeout inode …`, the address as hex `ADDRESS:PORT`.
 */
export function parseTcpTable(text: string): Map<number, number> {
  const portByInode = new Map<number, number>();
  for (const row of text.split('\n').slice(1)) {
    const columns = row.trim().split(/\s+/);
    if (columns.length < 10) continue;
    const port = Number.parseInt(columns[1]!.split(':')[1] ?? '', 16);
    const inode = Number(columns[9]);
    if (Number.isInteger(port) && Number.isInteger(inode) && inode > 0) portByInode.set(inode, port);
  }
  return portByInode;
}

function socketInodesOf(pid: number): Set<number> {
  const inodes = new Set<number>();
  let fds: string[];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return inodes;
  }
  for (const fd of fds) {
    try {
      const match = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (match) inodes.add(Number(match[1]));
    } catch {
      // closed while we looked
    }
  }
  return inodes;
}
