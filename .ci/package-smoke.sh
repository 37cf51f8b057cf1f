#!/usr/bin/env bash
# The package as a consumer gets it: `npm pack` from a clean tree of the committed files (no
# dist/: the package builds itself), installed with npm into an empty project, checked with
# `tsc --strict` and no skipLibCheck, its command run (--version, http), and a ten-line worker
# processing a job as an ES module, as a CommonJS `require`, and as a NestJS-style TypeScript
# file compiled to CommonJS. Also: the links of the packed Markdown resolve inside the package;
# the tarball alone installs on Node 20, 22 and 24 without an EBADENGINE or deprecation warning;
# plain JavaScript gets misspelt options refused; and the package loads under tsx, node --import
# tsx and ts-node in an ES module project and in a CommonJS one. Needs `npm ci` done here,
# Postgres at DATABASE_URL and Redis at REDIS_URL, and the registry for tsx and ts-node.
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
  | grep -Ev '^(dist/src/.*\.(js|d\.ts)|bin/idempotent-jobs\.js|README\.md|LICENSE|CHANGELOG\.md|package\.json|docs/[a-z-]+\.md|docs/images/[a-z-]+\.png)$' || true)"
if [ -n "$unexpected" ]; then
  echo "the package holds files it should not:" >&2
  echo "$unexpected" >&2
  exit 1
fi

echo "== links in the packed Markdown (README, CHANGELOG, docs/) resolve inside the package"
grep -qx 'docs/guide.md' "$work/files"
mkdir "$work/extracted"
tar -xzf "$project/$tarball" -C "$work/extracted"
(cd "$clean" && ./node_modules/.bin/tsx .ci/package-smoke/packed-links.ts "$work/extracted/package")
test "$(node -p "require('$work/extracted/package/package.json').repository.url")" = 'git+https://github.com/idempotent-jobs/idempotent-jobs.git'
# prepack's rewrite is undone by postpack: the tree packed from is as committed.
git -C "$root" show HEAD:README.md | cmp -s - "$clean/README.md"

cp .ci/package-smoke/worker.ts .ci/package-smoke/tsconfig.json .ci/package-smoke/worker.cjs .ci/package-smoke/misspelt-options.cjs .ci/package-smoke/http-requests.ts .ci/package-smoke/http-requests.cjs "$project/"
cp -r .ci/package-smoke/nest "$project/"
cd "$project"
npm init -y >/dev/null
npm pkg set type=module
# The project's own TypeScript compiler checks the consumer (installing another copy only costs time).
# Errors only, so that a refused install (a peer conflict, say) says why.
npm install --no-audit --no-fund --loglevel=error --prefer-offline "./$tarball" "@types/node@20"

# The peers at the versions this repository's lockfile tests (package.json's devDependencies).
peer() { node -p "require('$root/package.json').devDependencies['$1']"; }
node22="$root/tools/node-versions/node_modules/node22/bin"
node24="$root/tools/node-versions/node_modules/node24/bin"
# A project of its own for the TypeScript runners (see their section below), installed in the
# background from here on: each install mostly waits on npm's cache and the disk.
runners_project() {
  local dir="$work/$1"
  mkdir "$dir"
  cp "$root/.ci/package-smoke/runners/front-door.ts" "$root/.ci/package-smoke/runners/front-door.cts" "$root/.ci/package-smoke/runners/tsconfig.json" "$dir/"
  (
    cd "$dir"
    npm init -y >/dev/null
    if [ "$1" = runners-esm ]; then npm pkg set type=module; fi
    npm install --no-audit --no-fund --loglevel=error --prefer-offline "$project/$tarball" \
      "tsx@$(peer tsx)" "ts-node@10.9.2" "typescript@$(peer typescript)" "@types/node@20"
  )
}
runners_project runners-esm >"$work/runners-esm.log" 2>&1 &
runners_esm_pid=$!
runners_project runners-cjs >"$work/runners-cjs.log" 2>&1 &
runners_cjs_pid=$!
# Waits for a background step; prints its log, and fails with it.
await_step() {
  local pid="$1" log="$2" status=0
  wait "$pid" || status=$?
  cat "$log"
  return "$status"
}

echo "== npm install of the package alone on Node 20, 22 and 24: no warning from its dependency tree"
# EBADENGINE (a dependency that refuses one of the Nodes engines allows) or a deprecated
# package. The repository's own overrides do not reach a user's install, so the ranges in
# dependencies must install clean by themselves. The three at once.
clean_install() {
  local bin="$1" dir
  dir="$(mktemp -d "$work/install.XXXX")"
  cd "$dir"
  [ -z "$bin" ] || export PATH="$bin:$PATH"
  npm init -y >/dev/null
  npm install --no-audit --no-fund --prefer-offline "$project/$tarball" >install.out 2>&1
  echo "Node $(node --version): $(grep -c . install.out) lines of npm output"
  if grep -iE '^npm warn (EBADENGINE|deprecated)' install.out; then
    echo "npm warned installing the package on Node $(node --version):" >&2
    cat install.out >&2
    exit 1
  fi
}
clean_pids=()
for bin in "" "$node22" "$node24"; do
  (clean_install "$bin") >"$work/clean-install-${#clean_pids[@]}.log" 2>&1 &
  clean_pids+=("$!")
done
for i in "${!clean_pids[@]}"; do await_step "${clean_pids[$i]}" "$work/clean-install-$i.log"; done

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
echo "== misspelt options refused from plain JavaScript"
timeout 60 node misspelt-options.cjs | tee misspelt-options.out
grep -qF 'new IdempotencyKeys(options): unknown option "leaseMS". Did you mean "leaseMs"?' misspelt-options.out
grep -qF 'createIdempotentWorker(options): unknown option "concurency". Did you mean "concurrency"?' misspelt-options.out
grep -qF 'createIdempotentWorker(options): backend "postgress" is not one of "redis", "postgres". Did you mean "postgres"?' misspelt-options.out
echo "== Idempotency-Key on an endpoint (idempotent-jobs/http-idempotency, no Express or NestJS installed): ES module, then require()"
test ! -e node_modules/express && test ! -e node_modules/@nestjs/common
expected='answered ["created",201,"replayed",201,'
timeout 60 node dist/http-requests.js | tee http-requests.out
grep -qF "$expected" http-requests.out
timeout 60 node http-requests.cjs | tee http-requests-cjs.out
grep -qF "$expected" http-requests-cjs.out
grep -qx 'adapters function,function,function' http-requests-cjs.out
echo "== idempotent-jobs/nestjs and idempotent-jobs/bull-board with their optional peers, from an ES module and through require()"
npm install --no-save --no-audit --no-fund --loglevel=error --prefer-offline \
  "@nestjs/common@$(peer @nestjs/common)" "@nestjs/core@$(peer @nestjs/core)" "@nestjs/bullmq@$(peer @nestjs/bullmq)" \
  "@bull-board/api@$(peer @bull-board/api)" "reflect-metadata@$(peer reflect-metadata)" "rxjs@$(peer rxjs)"
node --input-type=module -e "
  const nestjs = await import('idempotent-jobs/nestjs');
  const board = await import('idempotent-jobs/bull-board');
  if (typeof nestjs.IdempotentJobsModule.forRoot !== 'function' || typeof board.IdempotentJobsAdapter !== 'function') throw new Error('missing exports');
  console.log('ES module: idempotent-jobs/nestjs and idempotent-jobs/bull-board load');"
node -e "
  const nestjs = require('idempotent-jobs/nestjs');
  const board = require('idempotent-jobs/bull-board');
  if (typeof nestjs.IdempotentJobsModule.forRootAsync !== 'function' || typeof board.keyInspectorLink !== 'function') throw new Error('missing exports');
  console.log('require(): idempotent-jobs/nestjs and idempotent-jobs/bull-board load');"
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
echo "== TypeScript runners (tsx, ts-node) in an ES module project and in a CommonJS one (npm init -y)"
# How most TypeScript users run code: each runner imports the package, makes a key store and
# exits 0. tsx compiles the package itself to CommonJS in a CommonJS project, so neither the
# package nor its dependencies may rely on import.meta.resolve or an import-only export.
front_door() {
  local dir="$1"
  shift
  echo "-- ($(basename "$dir")) $*"
  (cd "$dir" && timeout 120 "$@" 2>&1 | tee "$work/front-door.out")
  grep -qx 'front door: IdempotencyKeys made' "$work/front-door.out"
}
await_step "$runners_esm_pid" "$work/runners-esm.log"
esm="$work/runners-esm"
front_door "$esm" npx --no -- tsx front-door.ts
front_door "$esm" node --import tsx front-door.ts
front_door "$esm" node --loader ts-node/esm front-door.ts
await_step "$runners_cjs_pid" "$work/runners-cjs.log"
cjs="$work/runners-cjs"
# npm init -y writes "type": "commonjs" (npm 11) or no type at all (npm 10): CommonJS either way.
case "$(cd "$cjs" && npm pkg get type)" in '"commonjs"' | '{}') ;; *) echo "runners-cjs is not a CommonJS project" >&2; exit 1 ;; esac
front_door "$cjs" npx --no -- tsx front-door.ts
front_door "$cjs" node --import tsx front-door.ts
front_door "$cjs" npx --no -- ts-node front-door.ts
front_door "$cjs" npx --no -- ts-node front-door.cts
# tsx runs a .cts file through Node's module hooks, where Node 20 fails to require() an ES
# module with imports of its own ("request for './x.js' is not in cache") and a CommonJS package
# that requires another (`import { pino } from 'pino'` alone fails so, in a project with nothing
# else): a tsx-on-Node-20 defect no package can avoid, so the .cts case runs on Node 22 and 24.
for bin in "$node22" "$node24"; do
  front_door "$cjs" env PATH="$bin:$PATH" npx --no -- tsx front-door.cts
  front_door "$esm" env PATH="$bin:$PATH" npx --no -- tsx front-door.cts
done
echo "package smoke: OK"
