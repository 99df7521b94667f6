// Evaluate every case with posthog-node 5's own local evaluator, the clock pinned.
//
//     node differential/evaluate.mjs HOST PROJECT_KEY PERSONAL_KEY NOW CASES OUT
//
// The client loads the definitions from flagpost's feed, as an app in local-evaluation
// mode does, then evaluates each case with getAllFlagsAndPayloads({onlyEvaluateLocally}).
// A flag the SDK cannot decide locally is absent from its answer. OUT gets one object
// per case: {"flags": {key: value}, "payloads": {key: payload}}. NOW (RFC 3339) replaces
// the clock: `Date.now()` and `new Date()` return it.

import { readFileSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'

const [host, key, personal, now, casesFile, out] = process.argv.slice(2)

const frozen = Date.parse(now)
const RealDate = Date
class FrozenDate extends RealDate {
  constructor(...args) {
    if (args.length === 0) {
      super(frozen)
    } else {
      super(...args)
    }
  }
  static now() {
    return frozen
  }
}
globalThis.Date = FrozenDate

const watchdog = setTimeout(() => {
  console.error('timed out')
  process.exit(2)
}, 120_000)

// The SDK is installed for the SDK tests under tests/sdk/node.
const require = createRequire(new URL('../node/package.json', import.meta.url))
const { PostHog } = require('posthog-node')

const { InconclusiveMatchError } = createRequire(require.resolve('posthog-node'))('@posthog/core')

const client = new PostHog(key, {
  host,
  personalApiKey: personal,
  featureFlagsPollingInterval: 3_600_000,
  flushAt: 1_000_000,
  disableGeoip: true,
})

// A later condition's match is the flag's value only if every condition before it was
// decided: the SDK returns it even when an earlier condition was inconclusive (a
// property it was not given), but a service that knows the person might have matched
// that earlier condition. Such an answer is inconclusive.
const poller = Object.getPrototypeOf(client.featureFlagsPoller)
const undecided = []
const matchFlag = poller.matchFeatureFlagProperties
poller.matchFeatureFlagProperties = async function (...args) {
  undecided.push(false)
  try {
    return await matchFlag.apply(this, args)
  } finally {
    undecided.pop()
  }
}
const matchCondition = poller.isConditionMatch
poller.isConditionMatch = async function (...args) {
  let result
  try {
    result = await matchCondition.apply(this, args)
  } catch (e) {
    if (e instanceof InconclusiveMatchError && undecided.length) undecided[undecided.length - 1] = true
    throw e
  }
  if (result === 'match' && undecided.length && undecided[undecided.length - 1]) {
    throw new InconclusiveMatchError('an earlier condition was inconclusive', 'missing_context')
  }
  return result
}
await client.reloadFeatureFlags()

const cases = JSON.parse(readFileSync(casesFile, 'utf8'))
const definitions = await (
  await fetch(`${host}/flags/definitions?token=${key}`, {
    headers: { Authorization: `Bearer ${personal}` },
  })
).json()
const answers = []
for (const c of cases) {
  const answer = { flags: {}, payloads: {} }
  // One flag at a time: the SDK evaluates a set of flags concurrently, which would
  // interleave the per-flag bookkeeping above.
  for (const flag of definitions.flags) {
    const result = await client.getAllFlagsAndPayloads(c.distinct_id, {
      groups: c.groups,
      personProperties: c.person_properties,
      groupProperties: c.group_properties,
      onlyEvaluateLocally: true,
      flagKeys: [flag.key],
    })
    Object.assign(answer.flags, result.featureFlags ?? {})
    Object.assign(answer.payloads, result.featureFlagPayloads ?? {})
  }
  answers.push(answer)
}
await client.shutdown(1000)
writeFileSync(out, JSON.stringify(answers))
clearTimeout(watchdog)
console.log(JSON.stringify({ sdk: 'posthog-node', cases: answers.length }))
