"""Submits a quote job over the HTTP API and waits for its result (Python standard library only).

    python3 submit.py <idempotency key> [base URL]

POSTs with an Idempotency-Key and `Prefer: wait=10`; if the answer is still 202 (the job is
queued or running), polls the job's URL (the Location header) with the same long wait until
it has finished. Prints each status and the final representation.
"""
import json
import os
import sys
import urllib.parse
import urllib.request

ITEMS = {"items": [{"cents": 250, "quantity": 4}, {"cents": 1999, "quantity": 1}]}


def call(request: urllib.request.Request) -> tuple[int, dict, str | None]:
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.load(response), response.headers.get("Location")


def submit(base: str, key: str) -> dict:
    post = urllib.request.Request(
        f"{base}/v1/queues/quotes/jobs",
        data=json.dumps(ITEMS).encode("utf-8"),
        headers={"Content-Type": "application/json", "Idempotency-Key": key, "Prefer": "wait=10"},
        method="POST",
    )
    status, job, location = call(post)
    print(f"POST {status} {job['state']}")
    while status == 202:
        status, job, _ = call(urllib.request.Request(urllib.parse.urljoin(base, location), headers={"Prefer": "wait=10"}))
        print(f"GET {status} {job['state']}")
    return job


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: submit.py <idempotency key> [base URL]")
    base_url = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("API_URL", "http://127.0.0.1:3000")
    print(json.dumps(submit(base_url, sys.argv[1])))
