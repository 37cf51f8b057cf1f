#!/usr/bin/env bash
# The package as a consumer gets it: `npm pack` from a clean tree of the committed files (no
# dist/: the package builds itself), installed with npm into an empty project, checked with
# `tsc --strict` and no skipLibCheck, its command run (--version, http), and a ten-line worker
# processing a job as an ES module, as a CommonJS `require`, and as a NestJS-style TypeScript
# file compiled to CommonJS. Needs `npm ci` done here, Postgres at DATABASE_URL and Redis at
# REDIS_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
work="$(mktemp -d)"
project="$work/consumer"
mkdir "$project"
suffix="$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
schema="package_smoke_$suffix"
prefix="package-smoke-$suffix"
http_pid=""
cleanup() {
  if [ -n "$http_pid" ]; then kill "$http_pid" 2>/dev/null || true; fi
  psql -q "$DATABASE_URL" -c "drop schema if exists $schema cascade" >/dev/null 2>&1 || true
  redis-cli -u "$REDIS_URL" --scan --pattern "$prefix:*" | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== npm pack from a clean tree (the committed files, no dist/)"
clean="$work/clean"
mkdir "$clean"
git archive HEAD | tar -x -C "$clean"
test ! -e "$clean/dist"
# The build's tools (TypeScript) as `npm ci` installed them here: the same lockfile.
ln -s "$root/node_modules" "$clean/node_modules"
(cd "$clean" && npm pack --silent --pack-destination "$project" >/dev/null)
tarball="$(cd "$project" && ls idempotent-jobs-*.tgz)"
tar -tzf "$project/$tarball" | sed 's#^package/##' >"$work/files"
echo "packed $tarball ($(wc -l <"$work/files") files)"
grep -qx 'dist/src/index.js' "$work/files"
unexpected="$(<"$work/files" \
  | grep -Ev '^(dist/src/.*\.(js|d\.ts)|bin/idempotent-jobs\.js|README\.md|LICENSE|CHANGELOG\.md|package\.json)$' || true)"
if [ -n "$unexpected" ]; then
  echo "the package holds files it should not:" >&2
  echo "$unexpected" >&2
  exit 1
fi

cp .ci/package-smoke/worker.ts .ci/package-smoke/tsconfig.json .ci/package-smoke/worker.cjs "$project/"
cp -r .ci/package-smoke/nest "$project/"
cd "$project"
npm init -y >/dev/null
npm pkg set type=module
# The project's own TypeScript compiler checks the consumer (installing another copy only costs time).
# Errors only, so that a refused install (a peer conflict, say) says why.
npm install --no-audit --no-fund --loglevel=error --prefer-offline "./$tarball" "@types/node@20"

echo "== tsc --strict, no skipLibCheck"
node "$root/node_modules/typescript/bin/tsc" -p .
echo "== npx idempotent-jobs --version, --help"
test "$(npx --no -- idempotent-jobs --version)" = "$(node -p 'require("idempotent-jobs/package.json").version')"
npx --no -- idempotent-jobs --help | head -5
export SCHEMA="$schema" REDIS_PREFIX="$prefix"
echo "== a ten-line worker (ES module)"
timeout 60 node dist/worker.js | tee worker.out
grep -q '"kind":"completed"' worker.out
echo "== the same worker through require() (CommonJS)"
timeout 60 node worker.cjs | tee worker-cjs.out
grep -q '"kind":"completed"' worker-cjs.out
echo "== a NestJS-style provider: TypeScript compiled with \"module\": \"commonjs\" (strict, no skipLibCheck)"
node "$root/node_modules/typescript/bin/tsc" -p nest
timeout 60 node nest/dist/payments.service.js | tee worker-nest.out
grep -q '"kind":"completed"' worker-nest.out
echo "== idempotent-jobs http (the HTTP API and the key inspector from the installed package)"
# The installed bin itself (not through npx, whose child would outlive a kill of npx).
HTTP_PORT=0 HTTP_QUEUES=payments HTTP_TOKENS=tok_smoke_0123456789abcdef=smoke ADMIN_TOKENS=adm_smoke_0123456789abcdef=ops \
  ./node_modules/.bin/idempotent-jobs http >http.out 2>&1 &
http_pid=$!
url=""
for _ in $(seq 60); do
  url="$(node -e 'for (const l of require("fs").readFileSync("http.out","utf8").split("\n")) { try { const e = JSON.parse(l); if (e.msg === "HTTP API listening") { console.log(e.url); break; } } catch {} }')"
  [ -n "$url" ] && break
  sleep 0.5
done
if [ -z "$url" ]; then
  cat http.out >&2
  exit 1
fi
curl -fsS "$url/healthz" >/dev/null
curl -fsS "$url/ui/" >inspector.html
grep -q '<title>Key inspector' inspector.html
kill "$http_pid"
wait "$http_pid" || true
http_pid=""
echo "package smoke: OK"
