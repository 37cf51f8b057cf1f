"""The BullMQ job id that `jobIdFor(scope, key)` gives in TypeScript, for producers in Python.

BullMQ refuses a second job with an id it already holds, so a producer that enqueues over
BullMQ's wire format with this id gets the same duplicate protection as `IdempotentProducer`.
The id hashes the JSON text of `[scope, key]` exactly as JavaScript's `JSON.stringify` writes
it: no spaces, and non-ASCII characters as themselves (UTF-8), never as `\\u` escapes, which is
what `ensure_ascii=False` gives (Python's default escapes them and yields another id).
Standard library only.
"""
import hashlib
import json


def job_id_for(scope: str, key: str) -> str:
    text = json.dumps([scope, key], separators=(",", ":"), ensure_ascii=False)
    return "ij_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


if __name__ == "__main__":
    # `python3 job_id.py` reads [scope, key] pairs as JSON lines on standard input and prints
    # one id per line: the test suite checks them against jobIdFor.
    import sys

    for line in sys.stdin:
        scope, key = json.loads(line)
        print(job_id_for(scope, key))
