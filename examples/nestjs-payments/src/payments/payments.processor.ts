import type { DataLayer, JobContext } from 'idempotent-jobs';
import { IdempotentProcessor, IdempotentWorkerHost, InjectDataLayer } from 'idempotent-jobs/nestjs';
import type { EntityManager } from 'typeorm';
import { CardGateway } from './card-gateway.js';
import { LedgerEntry } from './entities.js';

export interface Charge {
  readonly orderId: string;
  readonly cents: number;
}

/**
 * Charges each order once: the card charge is a step (recorded once; a run after a crash reads it
 * back instead of charging again, and the gateway gets the step's own idempotency key), then the
 * ledger row and the key's completion commit in one TypeORM transaction.
 */
@IdempotentProcessor('payments')
export class PaymentsProcessor extends IdempotentWorkerHost<Charge, { chargeId: string }> {
  constructor(
    private readonly gateway: CardGateway,
    @InjectDataLayer() private readonly orm: DataLayer<EntityManager>,
  ) {
    super();
  }

  async process(ctx: JobContext<Charge>) {
    const charge = await ctx.step('charge-card', (step) => this.gateway.charge(ctx.data.cents, { idempotencyKey: step.stepKey, signal: step.signal }));
    return ctx.transaction(this.orm, async (manager) => {
      await manager.insert(LedgerEntry, { key: ctx.key, cents: ctx.data.cents, chargeId: charge.chargeId });
      return { chargeId: charge.chargeId };
    });
  }
}
