// A user's handler module as `idempotent-jobs worker --handler` loads it: plain JavaScript,
// default export `async (ctx) => result`. An external-effect handler: the return value is stored.
export default async function echo(ctx) {
  return { echoed: ctx.data, key: ctx.key, fence: ctx.fence };
}
