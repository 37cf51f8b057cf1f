import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';
import { config } from '../config.js';

/** One booked payment. No unique constraint on the key: a job that took effect twice would leave two rows. */
@Entity({ name: 'nest_ledger', schema: config.schema })
export class LedgerEntry {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column('text')
  key!: string;

  @Column('int')
  cents!: number;

  @Column('text', { name: 'charge_id' })
  chargeId!: string;
}

/** The simulated card gateway's own record of each charge request (one row per request). */
@Entity({ name: 'nest_gateway_charges', schema: config.schema })
export class GatewayCharge {
  @PrimaryGeneratedColumn()
  id!: number;

  /** The idempotency key the gateway was given (`step.stepKey`). */
  @Column('text', { name: 'request_key' })
  requestKey!: string;

  @Column('int')
  cents!: number;
}
