"""Run SQL statements in one chdb session (ClickHouse in-process) for
tests/integration/sink/current.rs.

Usage: chdb_run.py JOB.json, where the job is {"path": a session directory,
"statements": [sql, ...]}. The statements run in order in one session, each answering
TabSeparated unless its SQL names a FORMAT. Prints one JSON object: {"results": [the
base64 of each answer]}, or, at the first statement that fails, {"failed": its index,
"error": the message, "results": the answers before it}.
"""

import base64
import json
import sys

from chdb.session import Session


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    session = Session(job["path"])
    results = []
    try:
        for i, sql in enumerate(job["statements"]):
            try:
                answer = session.query(sql, "TabSeparated").bytes()
            except Exception as e:  # chdb raises its own error type per failure
                print(json.dumps({"failed": i, "error": str(e), "results": results}))
                return 1
            results.append(base64.b64encode(answer).decode("ascii"))
    finally:
        session.close()
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
