import type { Logger } from 'pino';
import { DataLayerElsewhereError } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { DataLayer } from '../store/data-layer.js';
import { isDataLayerHandler } from './database-only-handler.js';

/**
 * The data layers a worker or consumer checks at start: those it was given (`dataLayers`), and
 * a database-only handler's own (`databaseOnly(dataLayer, …)`).
 */
export function dataLayersToCheck(named: readonly DataLayer<any>[] | undefined, handler: unknown): DataLayer<unknown>[] {
  const layers = new Set<DataLayer<unknown>>(named ?? []);
  if (isDataLayerHandler(handler)) layers.add(handler.dataLayer);
  return [...layers];
}

/**
 * Checks each data layer against the keys ({@link IdempotencyKeys.checkDataLayer}) before a
 * worker or consumer takes its first message. Returns the refusal of the first one on another
 * database (logged at error level: the start stops there, and waiting cannot fix it); a check
 * that could not be carried out (Postgres unreachable) is logged and left to the data layer's
 * first transaction, so a database that is down delays nothing but the check.
 */
export async function checkDataLayersAtStart(keys: IdempotencyKeys, layers: readonly DataLayer<unknown>[], log: Logger): Promise<DataLayerElsewhereError | undefined> {
  for (const layer of layers) {
    try {
      await keys.checkDataLayer(layer);
    } catch (error) {
      if (error instanceof DataLayerElsewhereError) {
        log.error({ err: error, dataLayer: layer.name }, `not starting: ${error.message}`);
        return error;
      }
      log.warn({ err: error, dataLayer: layer.name }, `could not check the ${layer.name} data layer at start; it is checked at its first transaction instead`);
    }
  }
  return undefined;
}
