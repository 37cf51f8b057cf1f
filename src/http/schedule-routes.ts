import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import type { Kysely } from 'kysely';
import { Schedules, type ScheduleInfo } from '../ops/schedules.js';
import { operatorOf } from './operator-access.js';
import { HttpProblem } from './problems.js';
import { BearerAuthenticator } from './request-headers.js';

/** Options of {@link scheduleRoutes}. */
export interface ScheduleRoutesOptions {
  /** The database holding the `schedules` table. */
  readonly db: Kysely<any>;
  /** Its schema. */
  readonly schema: string;
  /** Admin token → operator name (as for the key inspector); empty: loopback only. */
  readonly adminTokens: ReadonlyMap<string, string>;
}

/** A schedule as the HTTP API answers it: {@link ScheduleInfo} with its times in ISO 8601. */
function toJson(schedule: ScheduleInfo) {
  return {
    ...schedule,
    lastTick: schedule.lastTick?.toISOString() ?? null,
    nextTick: schedule.nextTick?.toISOString() ?? null,
  };
}

/**
 * `GET /schedules` (every schedule, by name) and `GET /schedules/{name}` (one, 404 if none), each
 * with its spec, missed-ticks policy, queue, job name, payload, last tick enqueued and next tick.
 * Schedules are the service's, not a tenant's: like the key inspector, these routes need an admin
 * token (`ADMIN_TOKENS`), or a loopback server and request without admin tokens.
 */
export function scheduleRoutes(options: ScheduleRoutesOptions): FastifyPluginAsync {
  const schedules = new Schedules({ db: options.db, schema: options.schema });
  const admins = new BearerAuthenticator(options.adminTokens);
  return async (app: FastifyInstance) => {
    app.addHook('onRequest', async (request) => {
      operatorOf(admins, request, 'Reading schedules');
    });
    const tags = ['schedules'];
    app.get('', { schema: { summary: 'Every schedule, with its last and next tick.', tags } }, async (_request, reply) =>
      reply.type('application/json; charset=utf-8').send(JSON.stringify({ schedules: (await schedules.list()).map(toJson) })),
    );
    app.get<{ Params: { name: string } }>('/:name', { schema: { summary: 'One schedule, with its last and next tick.', tags } }, async (request, reply) => {
      // A name no schedule could have is a ValidationError from Schedules.get, answered 400.
      const schedule = await schedules.get(request.params.name);
      if (!schedule) throw new HttpProblem('not-found', `No schedule "${request.params.name}". GET /schedules lists them.`);
      return reply.type('application/json; charset=utf-8').send(JSON.stringify(toJson(schedule)));
    });
  };
}
