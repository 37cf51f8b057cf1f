/**
 * `idempotent-jobs/prisma`: the guarantee in your own Prisma code (an optional peer,
 * `@prisma/client`). `prismaDataLayer(prisma)` is a data layer whose transaction is an
 * interactive `prisma.$transaction`.
 *
 * @packageDocumentation
 * @module idempotent-jobs/prisma
 */
export type { PrismaDataLayerOptions, PrismaLikeClient, PrismaLikeTransaction, PrismaTransactionOf } from '../data-layers/prisma.js';
export { prismaDataLayer } from '../data-layers/prisma.js';
