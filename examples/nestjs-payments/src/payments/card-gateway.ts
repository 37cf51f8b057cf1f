import { setTimeout as sleep } from 'node:timers/promises';
import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import type { Repository } from 'typeorm';
import { config } from '../config.js';
import { GatewayCharge } from './entities.js';

/**
 * A stand-in for a card gateway: it takes a while to answer, records every request it gets, and
 * honours an idempotency key (a repeated key gets the first charge back), as real gateways do.
 */
@Injectable()
export class CardGateway {
  constructor(@InjectRepository(GatewayCharge) private readonly charges: Repository<GatewayCharge>) {}

  async charge(cents: number, options: { idempotencyKey: string; signal: AbortSignal }): Promise<{ chargeId: string }> {
    await sleep(config.gatewayDelayMs, undefined, { signal: options.signal });
    const earlier = await this.charges.findOneBy({ requestKey: options.idempotencyKey });
    const charge = earlier ?? (await this.charges.save(this.charges.create({ requestKey: options.idempotencyKey, cents })));
    return { chargeId: `ch_${charge.id}` };
  }
}
