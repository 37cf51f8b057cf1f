#!/usr/bin/env bash
# The package as a consumer gets it: `npm pack`, installed into an empty project, checked with
# `tsc --strict` and no skipLibCheck, its command run, and a ten-line worker processing a job.
# Needs a built tree (`npm run build`), Postgres at DATABASE_URL and Redis at REDIS_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
project="$(mktemp -d)/consumer"
mkdir "$project"
suffix="$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
schema="package_smoke_$suffix"
prefix="package-smoke-$suffix"
cleanup() {
  psql -q "$DATABASE_URL" -c "drop schema if exists $schema cascade" >/dev/null 2>&1 || true
  redis-cli -u "$REDIS_URL" --scan --pattern "$prefix:*" | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null || true
  rm -rf "$(dirname "$project")"
}
trap cleanup EXIT

tarball="$(npm pack --silent --pack-destination "$project")"
echo "packed $tarball"
unexpected="$(tar -tzf "$project/$tarball" | sed 's#^package/##' \
  | grep -Ev '^(dist/|bin/|deploy/|README\.md$|LICENSE$|CHANGELOG\.md$|package\.json$)' || true)"
if [ -n "$unexpected" ]; then
  echo "the package holds files it should not:" >&2
  echo "$unexpected" >&2
  exit 1
fi

cp .ci/package-smoke/worker.ts .ci/package-smoke/tsconfig.json "$project/"
cd "$project"
npm init -y >/dev/null
npm pkg set type=module
# The project's own TypeScript compiler checks the consumer (installing another copy only costs time).
npm install --no-audit --no-fund --silent --prefer-offline "./$tarball" "@types/node@20"

echo "== tsc --strict, no skipLibCheck"
node "$root/node_modules/typescript/bin/tsc" -p .
echo "== npx idempotent-jobs --help"
npx --no -- idempotent-jobs --help | head -5
echo "== a ten-line worker"
SCHEMA="$schema" REDIS_PREFIX="$prefix" timeout 60 node dist/worker.js | tee worker.out
grep -q '"kind":"completed"' worker.out
