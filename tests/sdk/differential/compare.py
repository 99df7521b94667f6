"""Compare flagpost's answers with each SDK's local evaluation, case by case.

    compare.py DIR NOW SDK...

DIR holds definitions.json, cases.json, flagpost.json (flagpost's `/flags?v=2` body per
case) and <sdk>.json per SDK (see evaluate.py). A flag the SDK left out is
inconclusive there and skipped. Every other flag must have the same value (variant or
boolean) and payload in flagpost, except where flagpost follows PostHog's flags service
against the SDKs by a documented choice (see `documented_choice`). Prints each
disagreement with a minimal reproducer (the flag, what it depends on, the case, the
clock), shaped as an entry of regressions.json, then a JSON summary as the last line.
"""

import json
import re
import sys

DATE_OPERATORS = ("is_date_before", "is_date_after", "is_date_exact")
MAX_ID_CHARS = 200


def load(path):
    with open(path) as f:
        return json.load(f)


def flagpost_value(detail):
    if detail is None:
        return "absent"
    if detail["enabled"] and detail.get("variant"):
        return detail["variant"]
    return detail["enabled"]


def normal_payload(payload):
    if isinstance(payload, str):
        try:
            return json.loads(payload)
        except ValueError:
            return payload
    return payload


class Closure:
    """Everything one flag's value depends on: its filters, the flags and cohorts they
    reference, transitively."""

    def __init__(self, definitions, key):
        self.by_key = {f["key"]: f for f in definitions["flags"]}
        self.cohorts = definitions.get("cohorts") or {}
        self.flags, self.cohort_ids, self.leaves = [], [], []
        self.visit_flag(key)

    def visit_flag(self, key):
        flag = self.by_key.get(key)
        if flag is None or key in [f["key"] for f in self.flags]:
            return
        self.flags.append(flag)
        for condition in flag["filters"].get("groups") or []:
            for prop in condition.get("properties") or []:
                self.visit_leaf(prop)

    def visit_leaf(self, prop):
        if prop.get("type") == "flag":
            self.visit_flag(prop["key"])
        elif prop.get("type") == "cohort":
            cohort_id = str(prop["value"])
            if cohort_id in self.cohorts and cohort_id not in self.cohort_ids:
                self.cohort_ids.append(cohort_id)
                self.visit_group(self.cohorts[cohort_id])
        else:
            self.leaves.append(prop)

    def visit_group(self, group):
        for value in group.get("values") or []:
            if "values" in value:
                self.visit_group(value)
            else:
                self.visit_leaf(value)

    def reproducer(self, definitions):
        return {
            "flags": self.flags,
            "cohorts": {i: self.cohorts[i] for i in self.cohort_ids},
            "group_type_mapping": definitions.get("group_type_mapping"),
            "property_matching_version": definitions.get("property_matching_version"),
        }


def case_values(case, key):
    values = [case["person_properties"].get(key)]
    values += [props.get(key) for props in case["group_properties"].values()]
    return [v for v in values if v is not None]


STRICT_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
NUMERIC_OPERATORS = ("gt", "gte", "lt", "lte")


def strict_number(value):
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or (
        isinstance(value, str) and STRICT_NUMBER.fullmatch(value) is not None)


def documented_choice(sdk, closure, case):
    """Where PostHog's flags service and an SDK read a value differently and flagpost
    follows the service (docs/flags.md, "Where PostHog's server and SDKs differ"). Returns the
    choice, or None."""
    if len(case["distinct_id"]) > MAX_ID_CHARS:
        return "distinct ids are cut to 200 characters before hashing"
    if sdk == "python" and len(closure.flags) > 1 and any(
        flag["filters"].get("aggregation_group_type_index") is not None
        or any(c.get("aggregation_group_type_index") is not None
               for c in flag["filters"].get("groups") or [])
        for flag in closure.flags
    ):
        return ("a dependency is evaluated in its own context, groups included "
                "(posthog-python evaluates it with the dependent's properties, without groups)")
    if sdk == "node" and any(f["filters"].get("feature_enrollment") for f in closure.flags):
        return "feature_enrollment decides by the person's opt-in (posthog-node ignores it)"
    for leaf in closure.leaves:
        operator = leaf.get("operator") or "exact"
        values = case_values(case, leaf["key"])
        if operator in DATE_OPERATORS and any(
            isinstance(v, str) and re.fullmatch(r"\d+(\.\d+)?", v) for v in values
        ):
            return "a numeric string is a date in epoch seconds"
        if operator.startswith("semver_") and any(
            isinstance(v, str) and v.count(".") >= 3 for v in values
        ):
            return "a version with four parts is not semver"
        if sdk != "node":
            continue
        if operator in DATE_OPERATORS and any(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            return "a number is a date in epoch seconds (posthog-node reads milliseconds)"
        if operator in NUMERIC_OPERATORS and not (
            strict_number(leaf.get("value")) and all(strict_number(v) for v in values)
        ):
            return "text is a number only as written (posthog-node uses parseFloat, then compares text)"
    return None


def main():
    directory, now, sdks = sys.argv[1], sys.argv[2], sys.argv[3:]
    definitions = load(f"{directory}/definitions.json")
    cases = load(f"{directory}/cases.json")
    flagpost = load(f"{directory}/flagpost.json")
    summary = {"cases": len(cases), "flags": len(definitions["flags"]), "now": now}
    disagreements = []
    for sdk in sdks:
        answers = load(f"{directory}/{sdk}.json")
        counts = {"evaluations": 0, "agreements": 0, "inconclusive": 0,
                  "documented_choices": 0, "disagreements": 0}
        for index, (case, ours, theirs) in enumerate(zip(cases, flagpost, answers)):
            for flag in definitions["flags"]:
                key = flag["key"]
                if not flag.get("active", True):
                    continue
                counts["evaluations"] += 1
                if key not in theirs["flags"]:
                    counts["inconclusive"] += 1
                    continue
                expected = theirs["flags"][key]
                detail = ours["flags"].get(key)
                got = flagpost_value(detail)
                same = got == expected
                if same and detail is not None and detail["enabled"]:
                    same = normal_payload(detail["metadata"].get("payload")) == \
                        normal_payload(theirs["payloads"].get(key))
                if same:
                    counts["agreements"] += 1
                    continue
                closure = Closure(definitions, key)
                if documented_choice(sdk, closure, case):
                    counts["documented_choices"] += 1
                    continue
                counts["disagreements"] += 1
                # Shaped as an entry of regressions.json, to keep once the cause is fixed.
                disagreements.append({
                    "name": f"{sdk}, case {index}, {key}", "cause": "to name",
                    "now": now, "definitions": closure.reproducer(definitions),
                    "request": case, "flag": key, "value": expected,
                    "source": f"posthog-{sdk} local evaluation",
                    "sdk_payload": theirs["payloads"].get(key), "flagpost": detail,
                })
        summary[sdk] = counts
    for d in disagreements[:20]:
        print("DISAGREEMENT " + json.dumps(d, ensure_ascii=False))
    with open(f"{directory}/disagreements.json", "w") as f:
        json.dump(disagreements, f, ensure_ascii=False, indent=1)
    summary["disagreements"] = len(disagreements)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
