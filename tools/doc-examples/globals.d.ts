/**
 * What a TSDoc example may use without declaring it: the application's own objects, set up
 * once as the library's other examples show. `tools/check-doc-examples.ts` compiles every
 * example with these in scope; nothing else in the project sees them.
 */

/** The application's Kysely instance (`createPostgresDb`), holding its own tables and the keys. */
declare const db: import('kysely').Kysely<any>;

/** The claim protocol over `db` (`new IdempotencyKeys({ db })`). */
declare const keys: import('idempotent-jobs').IdempotencyKeys;

/** A producer of the `payments` queue (`new IdempotentProducer({ queue: 'payments', connection })`). */
declare const producer: import('idempotent-jobs').IdempotentProducer;

/** Another system's client that deduplicates by an idempotency key of its own: a payment provider. */
declare const payments: {
  charge(request: { readonly orderId: string; readonly cents: number; readonly idempotencyKey: string }): Promise<{ readonly chargeId: string }>;
};

/** Another such client: an e-mail service. */
declare const mailer: {
  send(message: { readonly to: string; readonly idempotencyKey: string }): Promise<{ readonly id: string }>;
};

/** The application's generated Prisma client (`prisma generate`), with a `Ledger` model. */
declare const prisma: {
  $transaction<T>(fn: (tx: PrismaTransaction) => Promise<T>, options?: { isolationLevel?: any; maxWait?: number; timeout?: number }): Promise<T>;
} & PrismaTransaction;

/** What the Prisma client's interactive transactions receive. */
interface PrismaTransaction {
  ledger: { create(args: { data: { orderId: number; cents: number } }): Promise<unknown> };
  $queryRawUnsafe<T = unknown>(query: string, ...values: any[]): Promise<T>;
}
