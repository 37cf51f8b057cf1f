import { counter } from '../metric-registry.js';

/**
 * The outbox relay's metrics, created on first use in the default registry:
 * `idempotent_jobs_outbox_relayed_total` (rows added to BullMQ and marked sent) and
 * `idempotent_jobs_outbox_relay_errors_total` (failed batches, retried).
 */
export function relayMetrics() {
  return {
    relayed: counter('outbox_relayed_total', 'Outbox rows added to BullMQ and marked sent.', ['schema']),
    errors: counter('outbox_relay_errors_total', 'Outbox relay batches that failed (retried at the next poll).', ['schema']),
  };
}
