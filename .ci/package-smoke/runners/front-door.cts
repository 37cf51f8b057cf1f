// Imported and run by each TypeScript runner the package smoke tries (tsx, ts-node), in an ES
// module project and in a CommonJS one: the package loads, a key store is made over a database
// handle (no connection is opened), and the process exits 0.
import { IdempotencyKeys, createPostgresDb } from 'idempotent-jobs';

const db = createPostgresDb({ connectionString: 'postgres://smoke@127.0.0.1:5432/smoke' });
const keys = new IdempotencyKeys({ db, leaseMs: 30_000 });
void db.destroy().then(() => console.log(`front door: ${keys.constructor.name} made`));
