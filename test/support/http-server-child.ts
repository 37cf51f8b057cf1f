/** Runs the runnable HTTP server (producers/http-server.ts, as `npm run http` does) as a child process. */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export interface HttpServerChild {
  readonly process: ChildProcess;
  /** Base URL from the "HTTP API listening" log line. */
  readonly url: string;
  /** Every JSON log line so far. */
  readonly lines: Array<Record<string, unknown>>;
  /** Resolves with the exit code (or signal) once the process has ended. */
  readonly exited: Promise<number | string>;
}

export async function startHttpServerChild(env: Record<string, string>, timeoutMs = 30_000): Promise<HttpServerChild> {
  const script = fileURLToPath(new URL('../../producers/http-server.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', script], {
    env: { ...process.env, LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: Array<Record<string, unknown>> = [];
  let stderr = '';
  child.stderr!.on('data', (chunk) => (stderr += chunk));
  const exited = once(child, 'exit').then(([code, signal]) => (code ?? signal) as number | string);
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`HTTP server: no "HTTP API listening" line within ${timeoutMs} ms. stderr: ${stderr.slice(-2000)}`)), timeoutMs);
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`HTTP server exited (${code}) before listening. stderr: ${stderr.slice(-2000)}`));
    });
    createInterface({ input: child.stdout! }).on('line', (text) => {
      let line: Record<string, unknown>;
      try {
        line = JSON.parse(text);
      } catch {
        line = { msg: text };
      }
      lines.push(line);
      if (line.msg === 'HTTP API listening') {
        clearTimeout(timer);
        resolve(String(line.url));
      }
    });
  });
  return { process: child, url, lines, exited };
}
