/**
 * One small order service on each framework the HTTP idempotency middleware supports (Express,
 * Fastify, NestJS), listening on a loopback port, so that one conformance table runs against all
 * three. Routes: `POST /orders` (a function handler, leased), `POST /fast-orders` (database-only,
 * on the fast path), both running the same {@link OrderHandler}; the client is the `x-client`
 * header.
 */
import 'reflect-metadata';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import express from 'express';
import Fastify from 'fastify';
import { Body, Controller, Module, Post, Req, UseInterceptors } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import {
  IdempotencyInterceptor,
  expressIdempotency,
  fastifyIdempotency,
  idempotencyContext,
  type IdempotentRequests,
  type IdempotentResponse,
  type RequestContext,
} from '../../src/http-idempotency/index.js';

/** What a route does, whatever the framework: the test's handler. */
export type OrderHandler = (ctx: RequestContext, body: any) => Promise<IdempotentResponse>;

export type Framework = 'express' | 'fastify' | 'nestjs';
export const FRAMEWORKS: readonly Framework[] = ['express', 'fastify', 'nestjs'];

export interface RunningApp {
  readonly url: string;
  close(): Promise<void>;
}

const clientOf = (headers: Record<string, string | string[] | undefined>) => {
  const value = headers['x-client'];
  return typeof value === 'string' ? value : undefined;
};

/** Starts `framework`'s app on an ephemeral loopback port. */
export async function startApp(framework: Framework, requests: IdempotentRequests, handler: OrderHandler): Promise<RunningApp> {
  switch (framework) {
    case 'express':
      return startExpress(requests, handler);
    case 'fastify':
      return startFastify(requests, handler);
    case 'nestjs':
      return startNest(requests, handler);
  }
}

async function startExpress(requests: IdempotentRequests, handler: OrderHandler): Promise<RunningApp> {
  const app = express();
  const idempotent = expressIdempotency(requests, { client: (req) => clientOf(req.headers) });
  app.post('/orders', express.json(), idempotent((ctx, req) => handler(ctx, req.body)));
  app.post('/fast-orders', express.json(), idempotent((ctx, req) => handler(ctx, req.body), { databaseOnly: true }));
  // The handler's own errors reach Express's error handling, as any route's do.
  app.use((error: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
    const status = (error as { status?: number }).status;
    res.status(typeof status === 'number' && status >= 400 && status < 600 ? status : 500).json({ error: (error as Error).message });
  });
  const server = await new Promise<Server>((resolve) => {
    const listening = app.listen(0, '127.0.0.1', () => resolve(listening));
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, close: () => closeServer(server) };
}

async function startFastify(requests: IdempotentRequests, handler: OrderHandler): Promise<RunningApp> {
  const app = Fastify();
  await app.register(fastifyIdempotency, { requests, client: (request) => clientOf(request.headers) });
  app.post('/orders', { config: { idempotency: true } }, (request) => handler(request.idempotency, request.body));
  app.post('/fast-orders', { config: { idempotency: { databaseOnly: true } } }, (request) => handler(request.idempotency, request.body));
  app.get('/orders/:id', async (request) => ({ id: (request.params as { id: string }).id }));
  const url = await app.listen({ host: '127.0.0.1', port: 0 });
  return { url, close: () => app.close() };
}

async function startNest(requests: IdempotentRequests, handler: OrderHandler): Promise<RunningApp> {
  const leased = new IdempotencyInterceptor(requests, { client: (req) => clientOf(req.headers) });
  const fast = new IdempotencyInterceptor(requests, { client: (req) => clientOf(req.headers), databaseOnly: true });
  // Decorators applied by hand (the test files are not compiled with experimentalDecorators).
  class OrdersController {
    create(req: object, body: unknown) {
      return handler(idempotencyContext(req), body);
    }
    createFast(req: object, body: unknown) {
      return handler(idempotencyContext(req), body);
    }
  }
  const proto = OrdersController.prototype;
  for (const [method, path, interceptor] of [['create', 'orders', leased], ['createFast', 'fast-orders', fast]] as const) {
    Req()(proto, method, 0);
    Body()(proto, method, 1);
    Reflect.decorate([Post(path), UseInterceptors(interceptor)], proto, method, Object.getOwnPropertyDescriptor(proto, method));
    Reflect.defineMetadata('design:paramtypes', [Object, Object], proto, method);
  }
  Controller()(OrdersController);
  class AppModule {}
  Module({ controllers: [OrdersController] })(AppModule);
  const app = await NestFactory.create(AppModule, new ExpressAdapter(express()), { logger: false });
  await app.listen(0, '127.0.0.1');
  const server = app.getHttpServer() as Server;
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, close: () => app.close() };
}

function closeServer(server: Server): Promise<void> {
  server.closeIdleConnections?.();
  return new Promise((resolve, reject) => server.close((error) => (error ? reject(error) : resolve())));
}
