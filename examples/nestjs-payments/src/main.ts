/**
 * The NestJS payments application: `POST /payments` enqueues a charge, the processor charges
 * the card once (a step) and books it in TypeORM, Bull Board at `/queues` shows each job's key,
 * `/health` is terminus's. SIGTERM drains the workers and releases the keys of jobs still running.
 */
import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { AppModule } from './app.module.js';
import { config } from './config.js';

const app = await NestFactory.create(AppModule, { logger: ['error', 'warn'] });
app.enableShutdownHooks();
await app.listen(config.port, '127.0.0.1');
console.log(`payments app listening on ${await app.getUrl()}`);
