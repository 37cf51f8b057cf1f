/** Child process for the tracing tests: the library's traced paths, run where `@opentelemetry/api` cannot be loaded. */
import { otel } from '../../src/telemetry/otel-api.js';
import { JobTracing } from '../../src/telemetry/job-tracing.js';
import { traceClaim } from '../../src/telemetry/claim-tracing.js';
import { MessageSpans } from '../../src/telemetry/message-spans.js';
import { RequestTracing } from '../../src/telemetry/http-tracing.js';
import { withTraceContext } from '../../src/telemetry/trace-carrier.js';
import { IdempotencyKeys } from '../../src/index.js';

const claimed = { kind: 'completed' as const, scope: 's', key: 'k', result: 1 };
const handler = () => 'answered';
const report = {
  apiLoaded: otel !== undefined,
  mainEntryLoaded: typeof IdempotencyKeys === 'function',
  jobRun: await new JobTracing('q', () => false).run({ id: '1', data: { traceparent: 'x' }, attemptsMade: 0 }, async () => 'ran'),
  claim: (await traceClaim('s', 'k', 'q', async () => claimed)).kind,
  messageSpans: MessageSpans.start('send q', 'producer', [{ attributes: () => ({}) }]) === undefined,
  handlerUnwrapped: new RequestTracing().wrap('/v1/x', handler) === handler,
  dataUnchanged: withTraceContext({ a: 1 }, undefined),
};
console.log(JSON.stringify(report));
