#!/bin/sh
# Submits a quote job over the HTTP API and waits for its result: ./submit.sh <key> [base URL]
# The POST answers 200 with the job's result once it has finished within the wait (202 if it is
# still queued or running: GET the Location to wait again); a repeat with the same key replays it. Needs curl only.
set -eu
key=${1:?usage: submit.sh <idempotency key> [base URL]}
base=${2:-${API_URL:-http://127.0.0.1:3000}}
body='{"items":[{"cents":250,"quantity":4},{"cents":1999,"quantity":1}]}'

# Prefer: wait=10 holds the answer until the job completes (up to 10 s), instead of polling.
curl --silent --show-error --write-out '\nHTTP %{http_code}\n' \
  --header 'Content-Type: application/json' \
  --header "Idempotency-Key: $key" \
  --header 'Prefer: wait=10' \
  --data "$body" \
  "$base/v1/queues/quotes/jobs"
