import type { Socket } from 'node:net';
import { PROBLEMS, problemType, type ProblemKind } from './problems.js';

/**
 * Fastify's `clientErrorHandler`: answers a request Node's HTTP parser refused (malformed
 * request line or headers, a GET whose body bytes arrive as a second request, headers over
 * the size limit, a client too slow to send its headers) as problem+json like every other
 * refusal, instead of Fastify's own JSON shape. There is no request object yet, so no
 * `instance` nor `requestId`. The connection is closed afterwards: its byte stream cannot be
 * trusted any more.
 */
export function answerClientError(error: NodeJS.ErrnoException, socket: Socket): void {
  // A reset connection has nobody to answer.
  if (error.code === 'ECONNRESET' || socket.destroyed) return;
  const [kind, detail] = clientProblem(error.code);
  const { status, title } = PROBLEMS[kind];
  const body = JSON.stringify({ type: problemType(kind), title, status, detail });
  if (socket.writable) {
    socket.write(
      `HTTP/1.1 ${status} ${title}\r\nContent-Type: application/problem+json; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy();
}

function clientProblem(code: string | undefined): [ProblemKind, string] {
  switch (code) {
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return ['request-timeout', 'The request did not arrive in time; send it again.'];
    case 'HPE_HEADER_OVERFLOW':
      return ['headers-too-large', 'The request headers are too large; send smaller ones.'];
    default:
      return ['malformed-http', 'The request is not well-formed HTTP/1.1 (request line, headers or framing); nothing was done.'];
  }
}
