import { BadRequestException, Body, Controller, HttpCode, Post } from '@nestjs/common';
import type { IdempotentProducer } from 'idempotent-jobs';
import { InjectIdempotentProducer } from 'idempotent-jobs/nestjs';
import type { Charge } from './payments.processor.js';

/** `POST /payments {"orderId": "42", "cents": 1999}`: enqueues the order's charge under the key `order-<orderId>`. */
@Controller('payments')
export class PaymentsController {
  constructor(@InjectIdempotentProducer('payments') private readonly payments: IdempotentProducer) {}

  @Post()
  @HttpCode(202)
  async charge(@Body() body: Partial<Charge>) {
    if (typeof body?.orderId !== 'string' || !/^[\w-]{1,64}$/.test(body.orderId) || !Number.isInteger(body.cents) || body.cents! <= 0) {
      throw new BadRequestException('Send {"orderId": "<letters, digits, - or _>", "cents": <a whole number above 0>}.');
    }
    const { jobId, status } = await this.payments.enqueue({ name: 'charge', key: `order-${body.orderId}`, data: { orderId: body.orderId, cents: body.cents! } });
    return { jobId, status };
  }
}
