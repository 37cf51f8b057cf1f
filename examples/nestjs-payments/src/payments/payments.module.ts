import { BullBoardModule } from '@bull-board/nestjs';
import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { IdempotentJobsModule } from 'idempotent-jobs/nestjs';
import { IdempotentJobsAdapter, keyInspectorLink } from 'idempotent-jobs/bull-board';
import { config } from '../config.js';
import { CardGateway } from './card-gateway.js';
import { GatewayCharge } from './entities.js';
import { PaymentsController } from './payments.controller.js';
import { PaymentsProcessor } from './payments.processor.js';

@Module({
  imports: [
    TypeOrmModule.forFeature([GatewayCharge]),
    IdempotentJobsModule.registerQueue({ name: 'payments', defaultJobOptions: { removeOnComplete: false, removeOnFail: false } }),
    // Bull Board finds the queue by name, as it finds @nestjs/bullmq's; each job links to its key's page.
    BullBoardModule.forFeature({ name: 'payments', adapter: IdempotentJobsAdapter, options: { externalJobUrl: keyInspectorLink(config.inspectorUrl) } }),
  ],
  controllers: [PaymentsController],
  providers: [CardGateway, PaymentsProcessor],
})
export class PaymentsModule {}
