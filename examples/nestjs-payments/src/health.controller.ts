import { Controller, Get } from '@nestjs/common';
import { HealthCheck, HealthCheckService } from '@nestjs/terminus';
import { IdempotentJobsHealthIndicator } from 'idempotent-jobs/nestjs';

/** `/health`: the keys' database writable, the workers running (503 otherwise). */
@Controller('health')
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly jobs: IdempotentJobsHealthIndicator,
  ) {}

  @Get()
  @HealthCheck()
  check() {
    return this.health.check([() => this.jobs.isHealthy('jobs')]);
  }
}
