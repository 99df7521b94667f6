"""Drive the official posthog-python client (3.x or 7.x) against a flagpost server and
print a JSON summary of what it did on stdout.

    client.py HOST PROJECT_KEY PERSONAL_KEY PREFIX

Every HTTP request the library makes is recorded at the transport (requests'
HTTPAdapter), with the events in it, so the caller can check that the server stored
exactly what went over the wire. Distinct ids start with PREFIX.
"""

import gzip
import json
import signal
import sys
import time
import uuid
import warnings
from urllib.parse import urlsplit

import posthog
import requests.adapters
from posthog import Posthog

# Bound the whole run: the test harness kills us too, but this fails with a traceback.
signal.alarm(90)
warnings.simplefilter("ignore", DeprecationWarning)

HOST, KEY, PERSONAL, PREFIX = sys.argv[1:5]
VERSION = posthog.VERSION
REQUESTS = []

_send = requests.adapters.HTTPAdapter.send


def recording_send(self, request, **kwargs):
    status = None
    try:
        response = _send(self, request, **kwargs)
        status = response.status_code
        return response
    finally:
        REQUESTS.append(describe(request, status))


requests.adapters.HTTPAdapter.send = recording_send


def describe(request, status):
    url = urlsplit(request.url)
    encoding = request.headers.get("Content-Encoding")
    body = request.body or b""
    if isinstance(body, str):
        body = body.encode()
    events = []
    if url.path.rstrip("/") in ("/batch", "/capture", "/e"):
        raw = gzip.decompress(body) if encoding == "gzip" else body
        payload = json.loads(raw)
        for e in payload.get("batch", []):
            events.append(
                {
                    "uuid": e.get("uuid"),
                    "event": e["event"],
                    "distinct_id": e.get("distinct_id"),
                }
            )
    return {
        "method": request.method,
        "url": request.url,
        "path": url.path,
        "query": url.query,
        "content_encoding": encoding,
        "status": status,
        "events": events,
    }


def client(**options):
    # Small timeouts: the server is on loopback, and every call must be bounded.
    return Posthog(
        KEY,
        host=HOST,
        timeout=5,
        feature_flags_request_timeout_seconds=5,
        **options,
    )


def poll(what, fn, deadline_s=20):
    """Retry `fn` until it returns a truthy value; the compactor applies events
    asynchronously, so stored person and group properties show up a little later."""
    deadline = time.monotonic() + deadline_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


user, anon, stranger = f"{PREFIX}-user", f"{PREFIX}-anon", f"{PREFIX}-stranger"
company = f"{PREFIX}-acme"
summary = {"sdk": "posthog-python", "version": VERSION, "ids": {}}

# Capture, identify/set, alias, group identify, without gzip.
plain = client(gzip=False)
signup = str(uuid.uuid4())
plain.capture(distinct_id=anon, event="signed up", properties={"step": 1}, uuid=signup)
if hasattr(plain, "identify"):  # 3.x; removed in 6.x in favour of set()
    plain.identify(distinct_id=user, properties={"email": f"{user}@example.com"})
plain.set(distinct_id=user, properties={"plan": "pro", "email": f"{user}@example.com"})
plain.alias(previous_id=anon, distinct_id=user)
plain.group_identify("company", company, {"seats": 50, "name": "Acme"})
order = str(uuid.uuid4())
plain.capture(
    distinct_id=user,
    event="order placed",
    properties={"amount": 30},
    groups={"company": company},
    uuid=order,
)
plain.flush()

# The same, gzipped.
zipped = client(gzip=True)
gzipped = str(uuid.uuid4())
zipped.capture(distinct_id=user, event="gzipped", properties={"n": 2}, uuid=gzipped)
zipped.flush()
summary["ids"] = {"signed up": signup, "order placed": order, "gzipped": gzipped}

# Remote evaluation (/decide or /flags), with stored person and group properties.
poll(
    "the stored person property",
    lambda: plain.get_feature_flag("pro-only", user, send_feature_flag_events=False),
)
poll(
    "the stored group property",
    lambda: plain.get_feature_flag(
        "big-orgs", user, groups={"company": company}, send_feature_flag_events=False
    ),
)
mark = len(REQUESTS)
summary["remote"] = {
    "always-on": plain.feature_enabled("always-on", user),
    "never": plain.feature_enabled("never", user),
    "pro-only": plain.feature_enabled("pro-only", user),
    "pro-only stranger": plain.feature_enabled("pro-only", stranger),
    "checkout": plain.get_feature_flag("checkout", user),
    "checkout payload": plain.get_feature_flag_payload("checkout", user),
    "always-on payload": plain.get_feature_flag_payload("always-on", user),
    "big-orgs": plain.get_feature_flag("big-orgs", user, groups={"company": company}),
    "all": plain.get_all_flags(user),
}
summary["remote_paths"] = sorted({r["path"] for r in REQUESTS[mark:]})

# Local evaluation from the definitions feed, with a personal key.
local = client(personal_api_key=PERSONAL)
local.load_feature_flags()
mark = len(REQUESTS)
pro, free = {"plan": "pro"}, {"plan": "free"}
big = {"company": {"seats": 11}}
summary["local"] = {
    "always-on": local.feature_enabled("always-on", stranger, only_evaluate_locally=True),
    "never": local.feature_enabled("never", stranger, only_evaluate_locally=True),
    "pro-only": local.feature_enabled(
        "pro-only", stranger, person_properties=pro, only_evaluate_locally=True
    ),
    "pro-only free": local.feature_enabled(
        "pro-only", stranger, person_properties=free, only_evaluate_locally=True
    ),
    "checkout": local.get_feature_flag("checkout", stranger, only_evaluate_locally=True),
    "checkout payload": local.get_feature_flag_payload(
        "checkout", stranger, only_evaluate_locally=True
    ),
    "big-orgs": local.get_feature_flag(
        "big-orgs",
        stranger,
        groups={"company": "big"},
        group_properties=big,
        only_evaluate_locally=True,
    ),
    "all": local.get_all_flags(
        stranger,
        groups={"company": "big"},
        person_properties=pro,
        group_properties=big,
        only_evaluate_locally=True,
    ),
}
summary["local_paths"] = sorted({r["path"] for r in REQUESTS[mark:]})

for c in (plain, zipped, local):
    c.shutdown()
summary["requests"] = REQUESTS
print(json.dumps(summary))
