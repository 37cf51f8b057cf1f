#!/bin/bash
# Before/after on the same machine window: alternates one drain per contender between another
# checkout (e.g. `git worktree add /tmp/ij-before <commit>` plus a node_modules symlink) and
# this one. Usage: bench/compare-trees.sh <other-checkout> [N]. Prints one JSON line per drain,
# prefixed with the repetition and "old" or "now". SPECS (optional) replaces the list of drains:
# "now bullmq-tx|old leased|now leased" (each "old" or "now", then a contender, then optionally
# environment settings for that drain, e.g. "now fast-path-group BENCH_GROUPS=2").
# BENCH_CONCURRENCY (default 16) applies to every drain. These drains run in-process
# (bench/profile-throughput.ts); for worker processes as deployed, see bench/deployed-ab.ts.
set -euo pipefail
other=${1:?usage: bench/compare-trees.sh <other-checkout> [N]}
n=${2:-10000}
here=$(cd "$(dirname "$0")/.." && pwd)
default_specs="now bullmq-tx|old leased|now leased|old fast-path|now fast-path|now leased-two-trip-commit|now fast-path-two-trip-commit|now leased-async-claim"
IFS='|' read -r -a specs <<< "${SPECS:-$default_specs}"
for rep in 1 2; do
  for spec in "${specs[@]}"; do
    set -- $spec
    dir=$here; [ "$1" = old ] && dir=$other
    tree=$1 contender=$2; shift 2
    echo "rep $rep $tree $contender $* $(cd "$dir" && env "$@" timeout 300 npx tsx bench/profile-throughput.ts "$contender" "$n")"
  done
done
