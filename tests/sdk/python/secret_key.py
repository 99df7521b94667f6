"""posthog-python 7 configured with a project secret key (phs_...) as `secret_key`:
loads the project's flag definitions and evaluates flags locally, never asking the
server to evaluate. Prints a JSON summary on stdout.

    python secret_key.py HOST PROJECT_KEY SECRET_KEY
"""

import json
import sys

import posthog
from posthog import Posthog

host, key, secret = sys.argv[1:4]
client = Posthog(
    key,
    host=host,
    secret_key=secret,
    poll_interval=600,
    disable_geoip=True,
    sync_mode=True,
)
client.load_feature_flags()
flags = {
    name: client.get_feature_flag(
        name,
        "local-user",
        person_properties={"plan": "pro"},
        only_evaluate_locally=True,
        send_feature_flag_events=False,
    )
    for name in ["always-on", "never", "pro-only", "checkout"]
}
summary = {
    "sdk": "posthog-python",
    "version": posthog.VERSION,
    "loaded": [f["key"] for f in client.feature_flags or []],
    "flags": flags,
}
client.shutdown()
print(json.dumps(summary))
