#!/bin/bash
# The Postgres side alone: each transaction shape the benchmark's contenders send, replayed by
# pgbench (16 clients, no Node, no Redis), so the cost of the key's row can be told apart from
# the worker's. Prints transactions/s and jobs/s per shape and the ratio of jobs/s to the
# baseline's, alternating the shapes for REPS repetitions of SECONDS each.
#
# Usage: [SHAPES="a b"] [PIPELINE_PROTOCOL=prepared] bench/postgres-side.sh [SECONDS=6] [REPS=3]. The
# pipelined-* shapes run with pgbench -M extended (as the worker sends them: each statement parsed
# anew), or with PIPELINE_PROTOCOL=prepared (parsed once per connection). Needs pgbench, psql and GNU awk; DATABASE_URL
# as for the tests (default postgres://postgres@127.0.0.1:5432/postgres). Works in a schema of
# its own (pgside_<random>), dropped at the end.
set -euo pipefail
seconds=${1:-6}
reps=${2:-3}
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
here=$(cd "$(dirname "$0")/.." && pwd)
schema="pgside_$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
scripts=$(mktemp -d)
trap 'psql -q "$url" -c "drop schema if exists $schema cascade" >/dev/null 2>&1; rm -rf "$scripts"' EXIT

(cd "$here" && SCHEMA=$schema DATABASE_URL=$url npx tsx src/cli/main.ts migrate >/dev/null)
# The benchmark's effect table (bench/support/bench-env.ts).
psql -q "$url" -c "create table $schema.bench_effects (id bigint generated always as identity primary key,
  scope text not null, key text not null, worker text not null, created_at timestamptz not null default now())"

# Each shape is a pgbench script; `\;` joins statements into one round trip, as the worker's
# merged strings do. Keys are random (as idempotency keys are); owner tokens derive from them.
key="'k' || :r"
owner="md5(:r::text)::uuid"
effect="insert into $schema.bench_effects (scope, key, worker) values ('s', $key, 'w')"
claim="select $schema.claim_new_key('s', $key, 'fp', $owner, 86400000, 2000, null, null, null, null)"
general_claim="select * from $schema.claim_key('s', $key, 'fp', $owner, 'complete', 30000, 86400000, 2000, false, null, null, null, null, 'c')"
store="select $schema.store_fast_path_result('s', $key, $owner, '{\"n\":1}')"
header='\set r random(1, 1000000000000)'

# One job per transaction: the baseline's transaction; with a second row like the effect's; with
# the key's row inserted by a bare statement (the least any key row costs); the fast path as the
# worker sends it for a new key (claim_new_key, the effect, the result with the COMMIT), without
# and with a result; and with claim_key, the general claim, which the fast path sends only for
# a key that already has a row.
cat > "$scripts/baseline.sql" <<EOF
$header
begin;
$effect;
commit;
EOF
cat > "$scripts/baseline+row.sql" <<EOF
$header
begin \; $effect;
$effect;
commit;
EOF
cat > "$scripts/bare-key-insert.sql" <<EOF
$header
begin \; insert into $schema.idempotency_keys (scope, key, fingerprint, status, owner, completed_at, expires_at) values ('s', $key, 'fp', 'completed', $owner, now(), now() + interval '1 day') on conflict do nothing returning fence;
$effect;
commit;
EOF
cat > "$scripts/fast-path-no-result.sql" <<EOF
$header
begin \; $claim;
$effect;
commit;
EOF
cat > "$scripts/fast-path.sql" <<EOF
$header
begin \; $claim;
$effect;
$store \; commit;
EOF
cat > "$scripts/fast-path-claim-key.sql" <<EOF
$header
begin \; $general_claim;
$effect;
$store \; commit;
EOF
# The leased path: the claim commits on its own, then the effect's transaction ends with the
# fenced completion.
cat > "$scripts/leased.sql" <<EOF
$header
select * from $schema.claim_key('s', $key, 'fp', $owner, 'lease', 30000, 86400000, 2000, false, null, null, null, null, 'c');
begin \; $effect;
select $schema.complete_key('s', $key, $owner, 1, '{"n":1}', 86400000, 'c') \; commit;
EOF

# Shapes of BATCH jobs per script. Job j's key and owner token, and an array of BATCH values.
batch=8
key_of() { echo "'k' || :r || '-$1'"; }
owner_of() { echo "md5(:r::text || '-$1')::uuid"; }
column() { local out="array[" j; for j in $(seq 1 $batch); do out+="$([ "$j" = 1 ] || echo ,)$("$@" "$j")"; done; echo "$out]"; }
value() { echo "$1"; }

# The leased path under load: the claim batcher sends concurrent claims as one claim_keys
# statement (one commit), then each job's effect transaction as above.
{
  echo "$header"
  echo "select * from $schema.claim_keys($(column value "'s'"), $(column key_of), $(column value "'fp'"), $(column owner_of), $(column value 30000), $(column value 86400000::bigint), $(column value 2000), false, $(column value null)::text[], $(column value null)::text[], $(column value null)::text[], $(column value null)::jsonb[], 'c');"
  for j in $(seq 1 $batch); do
    echo "begin \; insert into $schema.bench_effects (scope, key, worker) values ('s', $(key_of "$j"), 'w');"
    echo "select $schema.complete_key('s', $(key_of "$j"), $(owner_of "$j"), 1, '{\"n\":1}', 86400000, 'c') \; commit;"
  done
} > "$scripts/leased-claims-by-$batch.sql"

# Fast path + group commit, BATCH jobs in one transaction: the group's new keys claimed in one
# statement, then each job's savepoint riding with its effect, its result and savepoint release
# riding with the next job's statements, the last job's with the COMMIT.
{
  echo "$header"
  echo "begin \; select * from $schema.claim_new_keys($(column value "'s'"), $(column key_of), $(column value "'fp'"), $(column owner_of), $(column value 86400000::bigint), 2000, $(column value null)::text[], $(column value null)::text[], $(column value null)::text[], $(column value null)::jsonb[]);"
  closing=""
  for j in $(seq 1 $batch); do
    echo "${closing}savepoint job_$j \; insert into $schema.bench_effects (scope, key, worker) values ('s', $(key_of "$j"), 'w');"
    closing="select $schema.store_fast_path_result('s', $(key_of "$j"), $(owner_of "$j"), '{\"n\":1}') \; release savepoint job_$j \; "
  done
  echo "${closing}commit;"
} > "$scripts/fast-path-group-of-$batch.sql"

# Optimistic group of BATCH jobs (no savepoints): the effects one after another, then every
# key written once, as `completed` with its result, by one multi-row insert that rides with the
# COMMIT. A key that already has a row fails the insert (unique violation): the group rolls back
# and its jobs run again the careful way; that never happens here, as keys are new.
key_row() { echo "('s', $(key_of "$1"), 'fp', 'completed', $(owner_of "$1"), 1, 1, '{\"n\":1}', now(), now() + interval '1 day')"; }
{
  echo "$header"
  first="begin \; "
  for j in $(seq 1 $batch); do
    echo "${first}insert into $schema.bench_effects (scope, key, worker) values ('s', $(key_of "$j"), 'w');"
    first=""
  done
  rows=""
  for j in $(seq 1 $batch); do rows+="$([ "$j" = 1 ] || echo ,) $(key_row "$j")"; done
  echo "insert into $schema.idempotency_keys (scope, key, fingerprint, status, owner, fence, attempts, result, completed_at, expires_at) values$rows \; commit;"
} > "$scripts/optimistic-group-of-$batch.sql"

# The leased path with group commit, BATCH jobs: claims batched and committed (as above), then
# one transaction for the effects. With a savepoint per job (a careful group, which group commit
# runs when an optimistic group failed), and optimistic (no savepoints: every fenced completion
# rides with the COMMIT).
claims="select * from $schema.claim_keys($(column value "'s'"), $(column key_of), $(column value "'fp'"), $(column owner_of), $(column value 30000), $(column value 86400000::bigint), $(column value 2000), false, $(column value null)::text[], $(column value null)::text[], $(column value null)::text[], $(column value null)::jsonb[], 'c');"
completion() { echo "select $schema.complete_key('s', $(key_of "$1"), $(owner_of "$1"), 1, '{\"n\":1}', 86400000, 'c')"; }
{
  echo "$header"
  echo "$claims"
  closing="begin \; "
  for j in $(seq 1 $batch); do
    echo "${closing}savepoint job_$j \; insert into $schema.bench_effects (scope, key, worker) values ('s', $(key_of "$j"), 'w');"
    closing="$(completion "$j") \; release savepoint job_$j \; "
  done
  echo "${closing}commit;"
} > "$scripts/leased-group-of-$batch.sql"
{
  echo "$header"
  echo "$claims"
  first="begin \; "
  for j in $(seq 1 $batch); do
    echo "${first}insert into $schema.bench_effects (scope, key, worker) values ('s', $(key_of "$j"), 'w');"
    first=""
  done
  completions=""
  for j in $(seq 1 $batch); do completions+="$(completion "$j") \; "; done
  echo "${completions}commit;"
} > "$scripts/optimistic-leased-group-of-$batch.sql"

# The same two optimistic groups with their effects gathered (the jobs run at once, and the
# statements they send in the same turn go out as one string): BEGIN and every job's effect in
# one round trip, then the group's end (the keys' insert, or every fenced completion) with the
# COMMIT in another.
effects_of_batch() { local j out=""; for j in $(seq 1 $batch); do out+=" \\; insert into $schema.bench_effects (scope, key, worker) values ('s', $(key_of "$j"), 'w')"; done; echo "$out"; }
{
  echo "$header"
  echo "begin$(effects_of_batch);"
  rows=""
  for j in $(seq 1 $batch); do rows+="$([ "$j" = 1 ] || echo ,) $(key_row "$j")"; done
  echo "insert into $schema.idempotency_keys (scope, key, fingerprint, status, owner, fence, attempts, result, completed_at, expires_at) values$rows \; commit;"
} > "$scripts/gathered-group-of-$batch.sql"
{
  echo "$header"
  echo "$claims"
  echo "begin$(effects_of_batch);"
  completions=""
  for j in $(seq 1 $batch); do completions+="$(completion "$j") \; "; done
  echo "${completions}commit;"
} > "$scripts/gathered-leased-group-of-$batch.sql"

# The gathered leased group with its 8 completions as one statement (an UPDATE … FROM unnest
# of the group's keys, owners and results), against one complete_key call each.
{
  echo "$header"
  echo "$claims"
  echo "begin$(effects_of_batch);"
  echo "update $schema.idempotency_keys as k set status = 'completed', result = u.result, locked_until = null, completed_at = now(), updated_at = now(), expires_at = now() + interval '1 day' from unnest($(column key_of), $(column owner_of), $(column value "'{\"n\":1}'")::jsonb[]) as u(key, owner, result) where k.scope = 's' and k.key = u.key and k.owner = u.owner and k.fence = 1 and k.status = 'processing' \\; commit;"
} > "$scripts/gathered-leased-group-of-$batch-one-completion.sql"

# The same groups as group commit sends them now: the extended protocol, pipelined (pgbench's
# \startpipeline … \endpipeline: Parse/Bind/Execute per statement, one Sync), each statement
# with its own parameters. BEGIN, the keeping of the watched settings and every job's effect in
# one round trip; then the settings check, the keys' insert (`insert_completed_keys`) or every
# fenced completion, and the COMMIT in another. The `-unwatched` variant leaves the settings
# out, to show what watching them costs. Run with `-M extended` (pgbench needs it for pipelines).
watched="array['synchronous_commit','role','session_authorization','row_security','session_replication_role','search_path','statement_timeout','lock_timeout','idle_in_transaction_session_timeout','transaction_read_only','default_transaction_read_only','timezone','datestyle','intervalstyle','extra_float_digits','bytea_output','standard_conforming_strings']"
pipelined_group() {
  local watch=$1 leased=$2 j
  echo "$header"
  [ "$leased" = leased ] && echo "$claims"
  echo '\startpipeline'
  echo "begin isolation level read committed;"
  [ "$watch" = watched ] && echo "select set_config('idempotent_jobs.group_settings', $schema.group_settings($watched)::text, true);"
  for j in $(seq 1 $batch); do echo "insert into $schema.bench_effects (scope, key, worker) values ('s', $(key_of "$j"), 'w');"; done
  echo '\endpipeline'
  echo '\startpipeline'
  [ "$watch" = watched ] && echo "select $schema.check_group_settings($watched);"
  if [ "$leased" = leased ]; then
    for j in $(seq 1 $batch); do echo "$(completion "$j");"; done
  else
    echo "select $schema.insert_completed_keys($(column value "'s'"), $(column key_of), $(column value "'fp'"), $(column owner_of), $(column value 86400000::bigint), 2000, $(column value null)::text[], $(column value null)::text[], $(column value null)::text[], $(column value null)::jsonb[], $(column value "'{\"n\":1}'")::jsonb[]);"
  fi
  echo "commit;"
  echo '\endpipeline'
}
pipelined_group watched fast > "$scripts/pipelined-group-of-$batch.sql"
pipelined_group unwatched fast > "$scripts/pipelined-group-of-$batch-unwatched.sql"
pipelined_group watched leased > "$scripts/pipelined-leased-group-of-$batch.sql"

all_shapes=(baseline baseline+row bare-key-insert fast-path-no-result fast-path fast-path-claim-key leased "leased-claims-by-$batch"
  "fast-path-group-of-$batch" "optimistic-group-of-$batch" "leased-group-of-$batch" "optimistic-leased-group-of-$batch"
  "gathered-group-of-$batch" "gathered-leased-group-of-$batch" "gathered-leased-group-of-$batch-one-completion"
  "pipelined-group-of-$batch" "pipelined-group-of-$batch-unwatched" "pipelined-leased-group-of-$batch")
# SHAPES (optional): the shapes to run, separated by spaces (the baseline always runs).
if [ -n "${SHAPES:-}" ]; then read -r -a shapes <<< "baseline ${SHAPES}"; else shapes=("${all_shapes[@]}"); fi
lines="$scripts/lines"
for rep in $(seq 1 "$reps"); do
  for shape in "${shapes[@]}"; do
    protocol=simple; case $shape in pipelined-*) protocol=${PIPELINE_PROTOCOL:-extended} ;; esac
    tps=$(pgbench "$url" -n -M "$protocol" -c 16 -j 2 -T "$seconds" -f "$scripts/$shape.sql" 2>&1 | awk '/^tps/ {print $3}')
    per=1; case $shape in *-"$batch" | *-"$batch"-*) per=$batch ;; esac
    echo "$rep $shape $tps $per" | tee -a "$lines" | awk '{printf "rep %s  %-22s %7.0f tx/s  %7.0f jobs/s\n", $1, $2, $3, $3 * $4}'
  done
  # Empty the tables between repetitions so that they do not grow across them.
  psql -q "$url" -c "truncate $schema.bench_effects, $schema.idempotency_keys cascade"
done

# Per shape: median jobs/s, and the median (min-max) of its ratio to the same repetition's
# baseline (with an even number of repetitions, the lower of the middle two).
echo
echo "shape                  jobs/s (median)   x baseline, median (min-max) of $reps"
for shape in "${shapes[@]}"; do
  awk -v shape="$shape" '
    { jobs[$1, $2] = $3 * $4; reps[$1] = 1 }
    END {
      n = 0
      for (r in reps) { n++; j[n] = jobs[r, shape]; x[n] = jobs[r, shape] / jobs[r, "baseline"] }
      asort(j); asort(x)
      mid = int((n + 1) / 2)
      printf "%-22s %15.0f   %.2f (%.2f-%.2f)\n", shape, j[mid], x[mid], x[1], x[n]
    }' "$lines"
done
