import { ExpressAdapter } from '@bull-board/express';
import { BullBoardModule } from '@bull-board/nestjs';
import { Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { TypeOrmModule } from '@nestjs/typeorm';
import { DataSource } from 'typeorm';
import { IdempotentJobsModule } from 'idempotent-jobs/nestjs';
import { typeormDataLayer } from 'idempotent-jobs/typeorm';
import { config } from './config.js';
import { HealthController } from './health.controller.js';
import { GatewayCharge, LedgerEntry } from './payments/entities.js';
import { PaymentsModule } from './payments/payments.module.js';

@Module({
  imports: [
    TypeOrmModule.forRoot({ type: 'postgres', url: config.databaseUrl, schema: config.schema, entities: [LedgerEntry, GatewayCharge], synchronize: true }),
    // The keys in the same database, the effect in the DataSource TypeORM injects.
    IdempotentJobsModule.forRootAsync({
      inject: [DataSource],
      useFactory: (dataSource: DataSource) => ({
        database: config.databaseUrl,
        dataLayer: typeormDataLayer(dataSource),
        keys: { schema: config.schema, leaseMs: config.leaseMs },
        connection: { url: config.redisUrl },
        prefix: config.redisPrefix,
        worker: { concurrency: config.concurrency, shutdownTimeoutMs: config.shutdownTimeoutMs },
      }),
    }),
    BullBoardModule.forRoot({ route: '/queues', adapter: ExpressAdapter }),
    TerminusModule,
    PaymentsModule,
  ],
  controllers: [HealthController],
})
export class AppModule {}
