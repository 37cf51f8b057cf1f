/**
 * A small filesystem of the caller's own, to run out of space on purpose: an ext4 image of a
 * few megabytes mounted through a loop device (real block allocation and fsync), or a tmpfs
 * (memory; for machines without loop devices). A filler file takes the free space and gives it
 * back. Mounting needs root. {@link startPostgresOnSmallDisk} puts a private Postgres's data
 * directory, its write-ahead log, or both on one.
 *
 * What Postgres does when its disk is full (Postgres 15, measured by test/small-disk.test.ts):
 * - a table or index that must grow: the statement fails with 53100 ("could not extend file"),
 *   the server stays up, reads work, writes that fit in existing pages work;
 * - the write-ahead log needing a new segment: PANIC (53100, "could not write to file
 *   pg_wal/xlogtemp…"), every session is cut, crash recovery fails for the same reason and the
 *   server shuts itself down. It starts again only once there is space, and then has every
 *   commit it acknowledged.
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, chownSync, closeSync, mkdirSync, mkdtempSync, openSync, rmSync, statfsSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PrivatePostgres } from '../chaos/private-postgres.js';
import { postgresOsUser } from './daemon.js';
import { findSystemTool, missingToolLine } from './system-tools.js';

/** Options of {@link SmallDisk.mount}. */
export interface SmallDiskOptions {
  readonly sizeMb: number;
  /** `ext4`: an image file on a loop device; `tmpfs`: memory. @defaultValue `'ext4'` */
  readonly filesystem?: 'ext4' | 'tmpfs';
  /** Hand the mount's root to this user (the OS user Postgres runs as). */
  readonly owner?: { readonly uid: number; readonly gid: number };
}

/** A mounted small filesystem. */
export class SmallDisk {
  /** Where it is mounted. */
  readonly path: string;
  readonly filesystem: 'ext4' | 'tmpfs';
  /** The temporary directory holding the mount point and the ext4 image. */
  readonly #dir: string;
  #mounted = true;

  private constructor(dir: string, filesystem: 'ext4' | 'tmpfs') {
    this.#dir = dir;
    this.path = join(dir, 'mnt');
    this.filesystem = filesystem;
  }

  /** Makes and mounts the filesystem (root only). */
  static mount(options: SmallDiskOptions): SmallDisk {
    if (process.getuid?.() !== 0) throw new Error('mounting a small filesystem needs root');
    const filesystem = options.filesystem ?? 'ext4';
    const disk = new SmallDisk(mkdtempSync(join(tmpdir(), 'ij-small-disk-')), filesystem);
    // The server's user must reach the mount point through it.
    chmodSync(disk.#dir, 0o755);
    mkdirSync(disk.path);
    try {
      if (filesystem === 'tmpfs') {
        run('mount', ['-t', 'tmpfs', '-o', `size=${options.sizeMb}m,mode=0755`, 'ij-small-disk', disk.path]);
      } else {
        const image = join(disk.#dir, 'disk.img');
        closeSync(openSync(image, 'w'));
        run('truncate', ['-s', `${options.sizeMb}M`, image]);
        // -m 0: no blocks reserved for root, so the filler (root) and Postgres (its own user)
        // see the same free space.
        const mkfs = findSystemTool('mkfsExt4');
        if (mkfs === undefined) throw new Error(`no mkfs.ext4: ${missingToolLine('mkfsExt4')}`);
        run(mkfs, ['-q', '-F', '-m', '0', image]);
        run('mount', ['-o', 'loop', image, disk.path]);
      }
      if (options.owner) chownSync(disk.path, options.owner.uid, options.owner.gid);
      return disk;
    } catch (error) {
      disk.unmount();
      throw error;
    }
  }

  /** Bytes free for an unprivileged writer. */
  freeBytes(): number {
    const stats = statfsSync(this.path);
    return stats.bavail * stats.bsize;
  }

  get #fillerPath(): string {
    return join(this.path, 'filler');
  }

  /**
   * Writes a filler file until at most `leaveBytes` are free (0: until the filesystem refuses).
   * Returns how many bytes it wrote.
   */
  fill(leaveBytes = 0): number {
    const fd = openSync(this.#fillerPath, 'a');
    const block = Buffer.alloc(1 << 20);
    let written = 0;
    try {
      for (;;) {
        const room = this.freeBytes() - leaveBytes;
        if (room <= 0) break;
        try {
          written += writeSync(fd, block, 0, Math.min(block.length, room));
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code === 'ENOSPC') break;
          throw error;
        }
      }
    } finally {
      closeSync(fd);
    }
    return written;
  }

  /** Deletes the filler file: the space it took is free again. */
  free(): void {
    rmSync(this.#fillerPath, { force: true });
  }

  /** Unmounts (lazily, should a process still hold a file there) and deletes the image and mount point. */
  unmount(): void {
    if (this.#mounted) {
      this.#mounted = false;
      try {
        run('umount', ['-l', this.path]);
      } catch {
        // never mounted
      }
    }
    rmSync(this.#dir, { recursive: true, force: true });
  }
}

/** Which part of a Postgres cluster lives on the small disk. */
export type SmallDiskPlacement = 'all' | 'data' | 'wal';

/** Options of {@link startPostgresOnSmallDisk}. */
export interface PostgresOnSmallDiskOptions extends Omit<SmallDiskOptions, 'owner'> {
  /**
   * `all`: the whole data directory, write-ahead log included, as on a one-volume server;
   * `data`: the data directory, its write-ahead log elsewhere; `wal`: only the write-ahead log.
   * @defaultValue `'all'`
   */
  readonly placement?: SmallDiskPlacement;
  /** @defaultValue `20` */
  readonly maxConnections?: number;
}

/** A private Postgres with part of it on a {@link SmallDisk}. */
export interface PostgresOnSmallDisk {
  readonly postgres: PrivatePostgres;
  readonly disk: SmallDisk;
  /** Stops the server and unmounts the disk. */
  stop(): Promise<void>;
}

/** Mounts a small filesystem and starts a private Postgres ({@link PrivatePostgres}) with `placement` on it. */
export async function startPostgresOnSmallDisk(options: PostgresOnSmallDiskOptions): Promise<PostgresOnSmallDisk> {
  const owner = postgresOsUser();
  const disk = SmallDisk.mount({ ...options, ...(owner ? { owner } : {}) });
  const placement = options.placement ?? 'all';
  let walParent: string | undefined;
  try {
    // initdb makes the WAL directory itself, inside a parent the server's user owns.
    if (placement === 'data') walParent = mkdtempSync(join(tmpdir(), 'ij-small-disk-wal-'));
    const walDir = placement === 'wal' ? join(disk.path, 'pg_wal') : walParent ? join(walParent, 'pg_wal') : undefined;
    if (walParent && owner) chownSync(walParent, owner.uid, owner.gid);
    const postgres = await PrivatePostgres.start({
      maxConnections: options.maxConnections ?? 20,
      ...(placement === 'wal' ? {} : { parentDir: disk.path }),
      ...(walDir ? { walDir } : {}),
    });
    return {
      postgres,
      disk,
      async stop() {
        await postgres.destroy();
        disk.unmount();
        if (walParent) rmSync(walParent, { recursive: true, force: true });
      },
    };
  } catch (error) {
    disk.unmount();
    if (walParent) rmSync(walParent, { recursive: true, force: true });
    throw error;
  }
}

function run(program: string, args: string[]): void {
  try {
    execFileSync(program, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (error) {
    const stderr = String((error as { stderr?: Buffer }).stderr ?? '');
    throw new Error(`${program} ${args.join(' ')} failed: ${(error as Error).message}\n${stderr}`);
  }
}
