"""Evaluate every case with posthog-python's own local evaluator, the clock pinned.

    evaluate.py HOST PROJECT_KEY PERSONAL_KEY NOW CASES OUT

The client loads the definitions from flagpost's feed (`/flags/definitions`), as an app
in local-evaluation mode does, then evaluates each case with
`get_all_flags_and_payloads(only_evaluate_locally=True)`. A flag the SDK cannot decide
locally (InconclusiveMatchError) is absent from its answer. OUT gets one object per
case: {"flags": {key: value}, "payloads": {key: payload}}. `NOW` (RFC 3339) replaces
the clock the SDK reads for relative dates.
"""

import datetime
import json
import logging
import signal
import sys
import types
import warnings

import posthog.feature_flags as feature_flags
from posthog import Posthog

signal.alarm(120)
warnings.simplefilter("ignore")
logging.getLogger("posthog").setLevel(logging.CRITICAL)

HOST, KEY, PERSONAL, NOW, CASES, OUT = sys.argv[1:7]
FROZEN = datetime.datetime.fromisoformat(NOW.replace("Z", "+00:00"))


class FrozenDatetime(datetime.datetime):
    """datetime whose now() is the pinned instant (in the zone asked for)."""

    @classmethod
    def now(cls, tz=None):
        moment = FROZEN if tz is not None else FROZEN.replace(tzinfo=None)
        at = moment.astimezone(tz) if tz is not None else moment
        return cls(at.year, at.month, at.day, at.hour, at.minute, at.second,
                   at.microsecond, at.tzinfo)


# The evaluator reads `datetime.datetime.now`; give it a module whose datetime is frozen.
feature_flags.datetime = types.SimpleNamespace(
    datetime=FrozenDatetime, date=datetime.date, timedelta=datetime.timedelta,
    timezone=datetime.timezone,
)

# A later condition's match is the flag's value only if every condition before it was
# decided: the SDK returns it even when an earlier condition was inconclusive (a
# property it was not given), but a service that knows the person might have matched
# that earlier condition. Such an answer is inconclusive, as the SDK's own reason says.
_undecided = []
_match_flag_conditions = feature_flags._match_flag_conditions
_match_flag_condition = feature_flags._match_flag_condition


def match_flag_conditions(*args, **kwargs):
    _undecided.append(False)
    try:
        return _match_flag_conditions(*args, **kwargs)
    finally:
        _undecided.pop()


def match_flag_condition(*args, **kwargs):
    try:
        result = _match_flag_condition(*args, **kwargs)
    except feature_flags.InconclusiveMatchError:
        _undecided[-1] = True
        raise
    if _undecided and _undecided[-1] and result[0] == feature_flags.ConditionMatch.MATCH:
        raise feature_flags.InconclusiveMatchError("an earlier condition was inconclusive")
    return result


feature_flags._match_flag_conditions = match_flag_conditions
feature_flags._match_flag_condition = match_flag_condition

client = Posthog(KEY, host=HOST, personal_api_key=PERSONAL, enable_local_evaluation=True,
                 poll_interval=3600, sync_mode=True, disable_geoip=True)
client.load_feature_flags()
if not client.feature_flags:
    sys.exit("the SDK loaded no flag definitions from " + HOST)

with open(CASES) as f:
    cases = json.load(f)
answers = []
for case in cases:
    result = client.get_all_flags_and_payloads(
        case["distinct_id"],
        groups=case["groups"],
        person_properties=case["person_properties"],
        group_properties=case["group_properties"],
        only_evaluate_locally=True,
    )
    answers.append({"flags": result.get("featureFlags") or {},
                    "payloads": result.get("featureFlagPayloads") or {}})
client.shutdown()
with open(OUT, "w") as f:
    json.dump(answers, f, ensure_ascii=False)
print(json.dumps({"sdk": "posthog-python", "cases": len(answers),
                  "flags": len(client.feature_flags)}))
