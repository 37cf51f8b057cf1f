/**
 * The Prisma data layer (`idempotent-jobs/prisma`): the shared suite over a generated
 * PrismaClient with the `pg` driver adapter (`@prisma/adapter-pg`); the effect creates a row
 * through the model. The client is generated offline (`prisma generate` with no schema engine:
 * generating needs none) with the CLI of tools/prisma, from test/support/prisma/schema.prisma.
 */
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { PrismaPg } from '@prisma/adapter-pg';
import { prismaDataLayer } from '../src/prisma/index.js';
import { describeDataLayer } from './support/data-layer-suite.js';
import { prismaGenerate } from './support/prisma-cli.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const GENERATED = join(ROOT, 'node_modules/.cache/ij-prisma-test/client.ts');

type Tx = { ledger: { create(args: { data: { key: string; fence: number; worker: string } }): Promise<unknown> }; $queryRawUnsafe(text: string): Promise<unknown> };

describeDataLayer<Tx>('prisma', async (databaseUrl, schema) => {
  prismaGenerate('test/support/prisma/schema.prisma');
  const { PrismaClient } = (await import(pathToFileURL(GENERATED).href)) as { PrismaClient: new (options: unknown) => any };
  const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: databaseUrl, max: 8 }, { schema }) });
  return {
    layer: prismaDataLayer(prisma) as never,
    insert: async (tx, row) => {
      await tx.ledger.create({ data: row });
    },
    query: (tx, text) => tx.$queryRawUnsafe(text),
    close: () => prisma.$disconnect(),
  };
});
