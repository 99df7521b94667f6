"""Seeded generator of random but realistic flag definitions and evaluation cases.

    generate.py SEED FLAGS CASES OUT_DIR

Writes OUT_DIR/definitions.json (PostHog's local-evaluation format: flags, cohorts,
group_type_mapping, property_matching_version) and OUT_DIR/cases.json (distinct id,
person properties, groups and group properties per case). Values mix types on purpose:
numbers as text with and without spaces, booleans as text in any case, null, non-ASCII
text, dates in many spellings (absolute and relative), versions of 1 to 4 parts.
The same seed always gives the same files.
"""

import json
import random
import sys

GROUP_TYPES = {"0": "organization", "1": "company"}
# flagpost refuses a flag file with an operator PostHog's flags do not have (docs/flags.md).
INSTEAD_OF_NON_POSTHOG = {"starts_with": "icontains", "not_starts_with": "not_icontains",
                          "ends_with": "icontains", "not_ends_with": "not_icontains",
                          "between": "gte", "not_between": "lt"}

# Property values by the kind of key; each list mixes the spellings clients send.
TEXT = ["pro", "Pro", "PRO", "free", "team", "münchen", "MÜNCHEN", "Zürich", "école",
        "ann@gmail.com", "bob@Example.COM", "", "null", "true", "False", "n/a", "a b"]
NUMBERS = [0, 1, 5, 18, 30, 42.5, -3, 100, 1000, "30", "30 ", " 7", "18.0", "1e3",
           "eleven", "", True, False, None, "0", "-3"]
BOOLS = [True, False, "true", "false", "True", "FALSE", "yes", 0, 1, None, "1"]
DATES = ["2024-01-15", "2024-01-15T10:00:00Z", "2024-01-15T10:00:00+01:00",
         "2024-01-15 10:00:00+01", "2024-01-15T10:00:00+0100", "2024-01-15 10:00:00 +01:00",
         "2024-01-15 10:00:00 UTC", "2024-01-15T10:00:00.123Z", "2023-12-31T23:59:59Z",
         "2024-02-29", "2024-03-31T00:00:00Z", "2023-03-01", "2022-06-30 12:30:00",
         "2024-01-31T12:00:00-05:00", "2024-04-30", "2024-05-31T10:00:00Z",
         1705312800, 1711843200.5, "1705312800", "20240115", "not a date", None]
VERSIONS = ["1.2.3", "v1.2.3", "1.2", "2", "1.10.0", "1.2.3-beta.1", "2.0.0", "0.9.12",
            "1.2.3.4", "1.02.3", "banana", "3.0.0+build.7", 2, None, "10.4.1"]
KEYS = {
    "plan": TEXT, "email": TEXT, "city": TEXT, "name": TEXT,
    "age": NUMBERS, "score": NUMBERS, "seats": NUMBERS,
    "is_beta": BOOLS, "verified": BOOLS,
    "signup_date": DATES, "last_seen": DATES, "created_at": DATES,
    "app_version": VERSIONS, "version": VERSIONS,
}
PERSON_KEYS = ["plan", "email", "city", "age", "score", "is_beta", "verified",
               "signup_date", "last_seen", "app_version", "name"]
GROUP_KEYS = ["plan", "seats", "created_at", "version", "verified", "name"]

FILTER_TEXT = ["pro", "PRO", "free", "MÜNCHEN", "münchen", "zür", "gmail", "@example.com",
               "null", "true", "n/a", "É", "a b", "ann"]
FILTER_NUMBERS = [0, 5, 18, 30, "30", "18", 42.5, "1e3", 100, -3, "abc"]
FILTER_DATES = ["2024-01-15", "2024-01-15T10:00:00Z", "2024-01-15 10:00:00+01",
                "2024-01-15T09:30:00+01:00", "2024-01-15 10:00:00 UTC", "2023-12-31",
                "2024-02-29T00:00:00Z", "2024-03-01 00:00:00", "-1d", "-7d", "-3h",
                "-2w", "-1m", "-2m", "-3m", "-13m", "-1y", "-4y", "6m", "-30d", "-24h",
                "1705312800"]
FILTER_VERSIONS = ["1.2.3", "v1.2.0", "1.2", "2.0.0", "1.10.0", "0.9.0", "1"]
REGEXES = ["^pro$", "^[a-z]+@gmail\\.com$", "ü", "^$", "[0-9]", "com$", "(?i)^PRO", "^n.ll$",
           "^(free|team)$", "e"]


class Generator:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.cohort_ids = []

    def pick(self, items):
        return self.r.choice(items)

    def chance(self, p):
        return self.r.random() < p

    def filter_value(self, operator, key):
        kind = KEYS.get(key, TEXT)
        if operator in ("exact", "is_not"):
            pool = kind + ["true", "false", "TRUE", True, False]
            pool = [v for v in pool if v is not None]
            if self.chance(0.4):
                return [self.pick(pool) for _ in range(self.r.randint(1, 3))]
            return self.pick(pool)
        if operator in ("gt", "gte", "lt", "lte"):
            return self.pick(FILTER_NUMBERS)
        if operator in ("is_date_before", "is_date_after", "is_date_exact"):
            return self.pick(FILTER_DATES)
        if operator.startswith("semver_"):
            if operator == "semver_wildcard":
                return self.pick(["1.*", "1.2.*", "2.*", "0.*", "*"])
            return self.pick(FILTER_VERSIONS)
        if operator in ("regex", "not_regex"):
            return self.pick(REGEXES)
        if operator in ("icontains_multi", "not_icontains_multi"):
            return [self.pick(FILTER_TEXT) for _ in range(2)]
        if operator in ("between", "not_between"):
            low = self.r.randint(0, 30)
            return [low, low + self.r.randint(0, 50)]
        return self.pick(FILTER_TEXT)

    def operator_for(self, key):
        kind = KEYS.get(key, TEXT)
        common = ["exact", "is_not", "is_set", "is_not_set", "icontains", "not_icontains",
                  "regex", "not_regex", None]
        if kind is NUMBERS:
            specific = ["gt", "gte", "lt", "lte", "between", "not_between"]
        elif kind is DATES:
            specific = ["is_date_before", "is_date_after", "is_date_before",
                        "is_date_after", "is_date_exact"]
        elif kind is VERSIONS:
            specific = ["semver_eq", "semver_neq", "semver_gt", "semver_gte", "semver_lt",
                        "semver_lte", "semver_tilde", "semver_caret", "semver_wildcard"]
        elif kind is BOOLS:
            specific = ["exact", "exact", "is_not"]
        else:
            specific = ["starts_with", "not_starts_with", "ends_with", "not_ends_with",
                        "icontains_multi", "not_icontains_multi"]
        return self.pick(common + specific * 2)

    def property_filter(self, group_index=None, negatable=False):
        if group_index is None:
            key = self.pick(PERSON_KEYS + ["distinct_id"] if self.chance(0.1) else PERSON_KEYS)
        else:
            key = self.pick(GROUP_KEYS)
        operator = self.operator_for(key)
        value = self.filter_value(operator or "exact", key)
        # Operators PostHog's flags lack are drawn as before, so each seed's cases stay
        # as they were, and written as the PostHog operator flagpost refuses them for.
        if operator in ("between", "not_between"):
            value = value[0]
        operator = INSTEAD_OF_NON_POSTHOG.get(operator, operator)
        leaf = {"key": key, "value": value,
                "type": "person" if group_index is None else "group"}
        if operator is not None:
            leaf["operator"] = operator
        if operator in ("is_set", "is_not_set"):
            leaf["value"] = "is_set" if operator == "is_set" else "is_not_set"
        if group_index is not None:
            leaf["group_type_index"] = group_index
        if negatable and self.chance(0.25):
            leaf["negation"] = True
        return leaf

    def cohort_group(self, depth, available):
        values = []
        for _ in range(self.r.randint(1, 3)):
            if depth < 2 and self.chance(0.3):
                values.append(self.cohort_group(depth + 1, available))
            elif available and self.chance(0.2):
                leaf = {"key": "id", "type": "cohort", "value": self.pick(available)}
                if self.chance(0.3):
                    leaf["negation"] = True
                values.append(leaf)
            else:
                values.append(self.property_filter(negatable=True))
        return {"type": self.pick(["AND", "OR"]), "values": values}

    def cohorts(self, count):
        cohorts = {}
        for i in range(count):
            cohort_id = 100 + i
            cohorts[str(cohort_id)] = self.cohort_group(0, list(self.cohort_ids))
            self.cohort_ids.append(cohort_id)
        return cohorts

    def rollout(self):
        return self.pick([None, 100, 100, 50, 33.3, 12.75, 0, 99.9, 1, 66.67])

    def condition(self, aggregation, flags, variants):
        properties = []
        for _ in range(self.r.choice([0, 1, 1, 2, 2, 3])):
            roll = self.r.random()
            if roll < 0.1 and self.cohort_ids and aggregation is None:
                properties.append({"key": "id", "type": "cohort", "value": self.pick(self.cohort_ids),
                                   "operator": self.pick(["in", "not_in", None])})
            elif roll < 0.2 and flags:
                properties.append(self.dependency(flags))
            else:
                properties.append(self.property_filter(aggregation))
        condition = {"properties": properties, "rollout_percentage": self.rollout()}
        if variants and self.chance(0.25):
            condition["variant"] = self.pick([v["key"] for v in variants] + ["nope"])
        return condition

    def dependency(self, flags):
        dep = self.pick(flags)
        chain = list(dep.get("_chain", [])) + [dep["key"]]
        value = self.pick([True, False] + [v["key"] for v in dep["_variants"]])
        return {"key": dep["key"], "type": "flag", "value": value,
                "operator": "flag_evaluates_to", "dependency_chain": chain}

    def variants(self):
        if not self.chance(0.35):
            return []
        split = self.pick([[50, 50], [34, 33, 33], [33.33, 33.33, 33.34], [10, 20, 70], [100]])
        return [{"key": name, "rollout_percentage": pct}
                for name, pct in zip(["control", "test", "test-b"], split)]

    def flag(self, index, flags):
        key = f"flag-{index}"
        variants = self.variants()
        aggregation = self.pick([None, None, None, 0, 1]) if self.chance(0.3) else None
        conditions = []
        for _ in range(self.r.randint(1, 3)):
            own = None
            if aggregation is None and self.chance(0.15):
                own = self.pick([0, 1])
            condition = self.condition(own if own is not None else aggregation, flags, variants)
            if own is not None:
                condition["aggregation_group_type_index"] = own
            conditions.append(condition)
        filters = {"groups": conditions, "aggregation_group_type_index": aggregation}
        if variants:
            filters["multivariate"] = {"variants": variants}
        payloads = {}
        for value in ["true"] + [v["key"] for v in variants]:
            if self.chance(0.4):
                payloads[value] = json.dumps({"value": value, "n": index})
        filters["payloads"] = payloads
        if self.chance(0.1):
            filters["holdout"] = {"id": self.r.randint(1, 9),
                                  "exclusion_percentage": self.pick([10, 50, 2.5])}
        if self.chance(0.05) and aggregation is None:
            filters["feature_enrollment"] = True
        chain = []
        for condition in conditions:
            for prop in condition["properties"]:
                for dep_key in prop.get("dependency_chain", []):
                    if dep_key not in chain:
                        chain.append(dep_key)
        return {
            "id": index + 1, "key": key, "name": key, "active": not self.chance(0.05),
            "deleted": False, "version": 1, "filters": filters,
            "ensure_experience_continuity": self.chance(0.03),
            "_variants": variants, "_chain": chain,
        }

    def definitions(self, flag_count):
        cohorts = self.cohorts(6)
        flags = []
        for index in range(flag_count):
            flags.append(self.flag(index, [f for f in flags if f["active"]]))
        for flag in flags:
            del flag["_variants"], flag["_chain"]
        return {"flags": flags, "group_type_mapping": GROUP_TYPES, "cohorts": cohorts,
                "property_matching_version": self.pick([None, 1, 1, 2])}

    def properties(self, keys):
        props = {}
        for key in keys:
            if self.chance(0.85):
                props[key] = self.pick(KEYS[key])
        return props

    def case(self, index):
        distinct_id = self.pick([f"user-{index}", f"User-{index}@example.com", f"ü-{index}",
                                 f"{index}", "x" * 210 + str(index)]) if self.chance(0.3) else f"user-{index}"
        person = self.properties(PERSON_KEYS)
        if self.chance(0.05):
            person["distinct_id"] = "someone-else"
        for key in list(person):
            if self.chance(0.05):
                person[f"$feature_enrollment/flag-{self.r.randint(0, 40)}"] = self.pick(BOOLS)
        groups, group_properties = {}, {}
        for name in GROUP_TYPES.values():
            if self.chance(0.7):
                groups[name] = self.pick([f"{name}-{self.r.randint(1, 30)}", self.r.randint(1, 99)])
                group_properties[name] = self.properties(GROUP_KEYS)
        return {"distinct_id": distinct_id, "person_properties": person, "groups": groups,
                "group_properties": group_properties}


def main():
    seed, flag_count, case_count, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    generator = Generator(seed)
    definitions = generator.definitions(flag_count)
    cases = [generator.case(i) for i in range(case_count)]
    with open(f"{out}/definitions.json", "w") as f:
        json.dump(definitions, f, ensure_ascii=False)
    with open(f"{out}/cases.json", "w") as f:
        json.dump(cases, f, ensure_ascii=False)
    print(json.dumps({"seed": seed, "flags": len(definitions["flags"]), "cases": len(cases)}))


if __name__ == "__main__":
    main()
