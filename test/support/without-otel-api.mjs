// A module resolve hook (node --import) under which `@opentelemetry/api` is not installed: the
// library must load and run untraced, as it does for a BullMQ user who installs no OpenTelemetry.
import { register } from 'node:module';

register(
  'data:text/javascript,' +
    encodeURIComponent(`
      export async function resolve(specifier, context, next) {
        if (specifier === '@opentelemetry/api') {
          const error = new Error("Cannot find package '@opentelemetry/api'");
          error.code = 'ERR_MODULE_NOT_FOUND';
          throw error;
        }
        return next(specifier, context);
      }`),
);
