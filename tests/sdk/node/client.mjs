// Drive the official posthog-node client (4.x or 5.x) against a flagpost server and
// print a JSON summary of what it did on stdout.
//
//     node client.mjs PACKAGE HOST PROJECT_KEY PERSONAL_KEY PREFIX
//
// PACKAGE is `posthog-node` (5.x) or `posthog-node-v4` (4.x, installed under an alias).
// Every HTTP request the library makes goes through the `fetch` option, which records
// it with the events in it, so the caller can check that the server stored exactly
// what went over the wire. Distinct ids start with PREFIX.

import { randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { gunzipSync } from 'node:zlib'

const [pkg, host, key, personal, prefix] = process.argv.slice(2)
const { PostHog } = await import(pkg)
const version = JSON.parse(
  readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url))
).version

// Bound the whole run: the test harness kills us too, but this says where we were.
const watchdog = setTimeout(() => {
  console.error(`timed out; last step: ${step}`)
  process.exit(2)
}, 90_000)
let step = 'start'

const requests = []

async function recordingFetch(url, options) {
  const headers = Object.fromEntries(
    Object.entries(options.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v])
  )
  const entry = {
    method: options.method ?? 'GET',
    url,
    path: new URL(url).pathname,
    query: new URL(url).search.slice(1),
    content_encoding: headers['content-encoding'] ?? null,
    status: null,
    events: events(new URL(url).pathname, headers['content-encoding'], options.body),
  }
  requests.push(entry)
  const response = await fetch(url, options)
  entry.status = response.status
  return response
}

function events(path, encoding, body) {
  if (!/^\/(batch|capture|e)\/?$/.test(path) || body == null) return []
  const raw = encoding === 'gzip' ? gunzipSync(body).toString() : body.toString()
  return JSON.parse(raw).batch.map((e) => ({
    uuid: e.uuid ?? null,
    event: e.event,
    distinct_id: e.distinct_id ?? null,
  }))
}

function client(options = {}) {
  // Small timeouts and few retries: the server is on loopback and every call must
  // be bounded. A large flushAt and interval so only flush() sends.
  return new PostHog(key, {
    host,
    fetch: recordingFetch,
    flushAt: 100,
    flushInterval: 60_000,
    requestTimeout: 5_000,
    fetchRetryCount: 1,
    featureFlagsPollingInterval: 60_000,
    ...options,
  })
}

// The compactor applies events asynchronously, so stored person and group properties
// show up a little later: retry until they do.
async function poll(what, fn, deadlineMs = 20_000) {
  const deadline = Date.now() + deadlineMs
  for (;;) {
    const value = await fn()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

const user = `${prefix}-user`
const anon = `${prefix}-anon`
const stranger = `${prefix}-stranger`
const company = `${prefix}-acme`
const summary = { sdk: 'posthog-node', version }

// Capture, identify, alias, group identify. posthog-node 5 gzips unless told not to;
// 4.x never compresses.
step = 'capture'
const plain = client({ disableCompression: true })
const ids = { 'signed up': randomUUID(), 'order placed': randomUUID(), gzipped: randomUUID() }
plain.capture({ distinctId: anon, event: 'signed up', properties: { step: 1 }, uuid: ids['signed up'] })
plain.identify({ distinctId: user, properties: { plan: 'pro', email: `${user}@example.com` } })
plain.alias({ distinctId: user, alias: anon })
plain.groupIdentify({ groupType: 'company', groupKey: company, properties: { seats: 50, name: 'Acme' } })
plain.capture({
  distinctId: user,
  event: 'order placed',
  properties: { amount: 30 },
  groups: { company },
  uuid: ids['order placed'],
})
await plain.flush()

const zipped = client()
zipped.capture({ distinctId: user, event: 'gzipped', properties: { n: 2 }, uuid: ids.gzipped })
await zipped.flush()
summary.ids = ids

// Remote evaluation (/decide or /flags), with stored person and group properties.
step = 'remote flags'
const quiet = { sendFeatureFlagEvents: false }
await poll('the stored person property', () => plain.isFeatureEnabled('pro-only', user, quiet))
await poll('the stored group property', () =>
  plain.isFeatureEnabled('big-orgs', user, { ...quiet, groups: { company } })
)
let mark = requests.length
summary.remote = {
  'always-on': await plain.isFeatureEnabled('always-on', user),
  never: await plain.isFeatureEnabled('never', user),
  'pro-only': await plain.isFeatureEnabled('pro-only', user),
  'pro-only stranger': await plain.isFeatureEnabled('pro-only', stranger),
  checkout: await plain.getFeatureFlag('checkout', user),
  'checkout payload': await plain.getFeatureFlagPayload('checkout', user),
  'always-on payload': await plain.getFeatureFlagPayload('always-on', user),
  'big-orgs': await plain.getFeatureFlag('big-orgs', user, { groups: { company } }),
  all: await plain.getAllFlags(user),
}
summary.remote_paths = [...new Set(requests.slice(mark).map((r) => r.path))].sort()

// Local evaluation from the definitions feed, with a personal key.
step = 'local flags'
const local = client({ personalApiKey: personal })
await local.reloadFeatureFlags()
mark = requests.length
const only = { onlyEvaluateLocally: true }
const pro = { ...only, personProperties: { plan: 'pro' } }
const big = { groups: { company: 'big' }, groupProperties: { company: { seats: 11 } } }
summary.local = {
  'always-on': await local.isFeatureEnabled('always-on', stranger, only),
  never: await local.isFeatureEnabled('never', stranger, only),
  'pro-only': await local.isFeatureEnabled('pro-only', stranger, pro),
  'pro-only free': await local.isFeatureEnabled('pro-only', stranger, {
    ...only,
    personProperties: { plan: 'free' },
  }),
  checkout: await local.getFeatureFlag('checkout', stranger, only),
  'checkout payload': await local.getFeatureFlagPayload('checkout', stranger, undefined, only),
  'big-orgs': await local.getFeatureFlag('big-orgs', stranger, { ...only, ...big }),
  all: await local.getAllFlags(stranger, { ...pro, ...big }),
}
summary.local_paths = [...new Set(requests.slice(mark).map((r) => r.path))].sort()

step = 'shutdown'
for (const c of [plain, zipped, local]) await c.shutdown(10_000)
summary.requests = requests
clearTimeout(watchdog)
console.log(JSON.stringify(summary))
