// Plain JavaScript, where no type checker sees the options: a misspelt option name or an
// unknown backend is refused at once, naming the option and the closest known name.
'use strict';
const { IdempotencyKeys, createIdempotentWorker, createPostgresDb } = require('idempotent-jobs');

const db = createPostgresDb({ connectionString: 'postgres://smoke@127.0.0.1:5432/smoke' });
const keys = new IdempotencyKeys({ db });
const worker = { queue: 'smoke', connection: { host: '127.0.0.1' }, keys, handler: async () => 'done' };

function refusal(call) {
  try {
    call();
  } catch (error) {
    return error.message;
  }
  throw new Error('accepted a misspelt option');
}

console.log(refusal(() => new IdempotencyKeys({ db, leaseMS: 1000 })));
console.log(refusal(() => createIdempotentWorker({ ...worker, concurency: 4 })));
console.log(refusal(() => createIdempotentWorker({ ...worker, backend: 'postgress' })));
void db.destroy();
