/**
 * The layer rule of docs/architecture.md, as dependency-cruiser rules: `npm run lint` runs them
 * over src/ and the runnable folders, and test/architecture.test.ts holds them to the code.
 *
 * Rooms, bottom to top. A room imports only rooms below it; rooms on one floor never import
 * each other. The entry points (doors: src/index.ts and src/<name>/index.ts) may import any
 * room, and nothing in a room imports a door.
 */
const FOUNDATION = '^src/(errors|fingerprint|fault-hook|text-table|json-limits|describe-error|metric-registry|default-logger|service-unreachable)\\.ts$';
const DOOR = '^src/(index|(amqp|nats|otel|process|store|pg|postgres-js|drizzle|prisma|typeorm|knex|mikro-orm|nestjs|bull-board|http-idempotency)/index)\\.ts$';

/** Floors from the ground up; each entry is one floor's rooms. */
const FLOORS = [
  ['store'],
  ['telemetry'],
  ['protocol'],
  ['consumer'],
  ['bullmq', 'amqp', 'nats', 'ops', 'data-layers'],
  ['metrics'],
  ['http'],
  ['runtime', 'http-idempotency'],
  ['otel', 'nestjs', 'bull-board'],
  ['cli'],
];

const room = (name) => `^src/${name}/`;

/** One rule per room: it may not import the rooms on its floor or above it. */
const layerRules = FLOORS.flatMap((floor, level) =>
  floor.map((name) => {
    const forbidden = FLOORS.slice(level).flat().filter((other) => other !== name);
    return {
      name: `layer-${name}`,
      severity: 'error',
      comment: `src/${name}/ imports only rooms below it (${FLOORS.slice(0, level).flat().join(', ') || 'the foundation'}, and the foundation); never ${forbidden.join(', ')}.`,
      from: { path: room(name), pathNot: DOOR },
      to: { path: `^src/(${forbidden.join('|')})/`, pathNot: DOOR },
    };
  }),
);

/** A package that only its room may import (its optional peer, or its outside system). */
const onlyIn = (name, packages, rooms) => ({
  name,
  severity: 'error',
  comment: `${packages.join(', ')}: imported only in ${rooms.map((r) => `src/${r}/`).join(', ')} (and the doors re-export what they need).`,
  from: { path: '^src/', pathNot: `^src/(${rooms.join('|')})/` },
  to: { path: `(^|/)node_modules/(@types/)?(${packages.map((p) => p.replace(/[/.]/g, '\\$&')).join('|')})/` },
});

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'No import cycles: a cycle is two rooms (or files) that cannot be read, tested or moved apart.',
      from: {},
      to: { circular: true },
    },
    {
      name: 'foundation-is-the-ground',
      severity: 'error',
      comment: 'The foundation (errors, fingerprint, fault hook, JSON limits, the text table, the metric registry) imports no room.',
      from: { path: FOUNDATION },
      to: { path: '^src/[^/]+/' },
    },
    ...layerRules,
    {
      name: 'no-door-inside',
      severity: 'error',
      comment: 'A room never imports an entry point: the doors are for users and the runnable folders.',
      from: { path: '^src/', pathNot: DOOR },
      to: { path: DOOR },
    },
    {
      name: 'sql-stays-in-store',
      severity: 'error',
      comment: 'Statement files (src/store/sql/) are the store\'s own: everything else goes through KeyStore, OperatorStore or OutboxStore.',
      from: { pathNot: '^src/store/' },
      to: { path: '^src/store/sql/' },
    },
    onlyIn('amqplib-only-in-amqp', ['amqplib'], ['amqp']),
    onlyIn('nats-only-in-nats', ['@nats-io/jetstream', '@nats-io/transport-node', '@nats-io/nats-core'], ['nats']),
    onlyIn('otel-sdk-only-in-otel', ['@opentelemetry/sdk-node'], ['otel']),
    onlyIn('web-frameworks-only-in-http-idempotency', ['express', '@nestjs/common', '@nestjs/core', 'rxjs'], ['http-idempotency']),
    onlyIn('bullmq-only-in-bullmq', ['bullmq', 'ioredis'], ['bullmq']),
    onlyIn('nestjs-only-in-nestjs', ['@nestjs/common', '@nestjs/core', '@nestjs/bullmq'], ['nestjs']),
    onlyIn('bull-board-only-in-bull-board', ['@bull-board/api'], ['bull-board']),
    onlyIn('pg-only-in-store', ['pg'], ['store', 'data-layers']),
    onlyIn('data-layers-only-in-data-layers', ['postgres', 'drizzle-orm', 'typeorm', '@prisma/client', '@prisma/adapter-pg', 'knex', '@mikro-orm/core', '@mikro-orm/knex', '@mikro-orm/postgresql'], ['data-layers']),
    {
      name: 'runnables-use-doors',
      severity: 'error',
      comment: 'The runnable folders (workers, producers, demo, examples, bin) are thin callers: they import the entry points only.',
      from: { path: '^(workers|producers|demo|examples|bin)/' },
      to: { path: '^src/', pathNot: DOOR },
    },
    {
      name: 'benchmarks-use-doors',
      severity: 'error',
      comment: 'Benchmarks run what users run, through the entry points; the two that time internal pieces on their own (spans, the statistics statement) are named here.',
      from: { path: '^bench/', pathNot: '^bench/(tracing-overhead|operations-measure)\\.ts$' },
      to: { path: '^src/', pathNot: DOOR },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^(dist|docs/api|node_modules|examples/prisma-worker/generated|examples/nestjs-payments/dist)/' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { exportsFields: ['exports'], conditionNames: ['import', 'require', 'node', 'default', 'types'], extensions: ['.ts', '.js', '.mjs', '.cjs', '.d.ts'] },
  },
};
