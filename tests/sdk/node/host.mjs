// Drive posthog-node (4.x or 5.x) through the flag endpoints beyond evaluation:
// a remote config flag's payload, local evaluation of a flag that depends on another,
// and the definitions feed polled twice. Prints a JSON summary on stdout.
//
//     node host.mjs PACKAGE HOST PROJECT_KEY PERSONAL_KEY
//
// Every HTTP request goes through the `fetch` option and is recorded with its
// If-None-Match header and the status it got.

import { readFileSync } from 'node:fs'

const [pkg, host, key, personal] = process.argv.slice(2)
const { PostHog } = await import(pkg)
const version = JSON.parse(
  readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url))
).version

const watchdog = setTimeout(() => {
  console.error(`timed out; last step: ${step}`)
  process.exit(2)
}, 60_000)
let step = 'start'

const requests = []

/** What an SDK call gave the app: the value it returned, or the error it threw. */
async function outcome(call) {
  try {
    return { returned: (await call()) ?? null }
  } catch (e) {
    return { threw: String(e?.message ?? e) }
  }
}

async function recordingFetch(url, options) {
  const headers = Object.fromEntries(
    Object.entries(options.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v])
  )
  const u = new URL(url)
  const entry = {
    method: options.method ?? 'GET',
    path: u.pathname,
    query: u.search.slice(1),
    if_none_match: headers['if-none-match'] ?? null,
    status: null,
    etag: null,
  }
  requests.push(entry)
  const response = await fetch(url, options)
  entry.status = response.status
  entry.etag = response.headers.get('etag')
  if (/^\/(flags|decide)\/?$/.test(u.pathname)) {
    entry.evaluated_at = (await response.clone().json()).evaluatedAt ?? null
  }
  return response
}

const client = new PostHog(key, {
  host,
  personalApiKey: personal,
  fetch: recordingFetch,
  flushAt: 100,
  flushInterval: 60_000,
  requestTimeout: 5_000,
  fetchRetryCount: 0,
  // Polls only when told to, so the test decides when the second poll happens.
  featureFlagsPollingInterval: 600_000,
})
const summary = { sdk: 'posthog-node', version }
const quiet = { sendFeatureFlagEvents: false }

step = 'feed'
await client.reloadFeatureFlags()
await client.reloadFeatureFlags()
summary.feed = requests
  .filter((r) => r.path.includes('local_evaluation') || r.path.includes('definitions'))
  .map(({ path, if_none_match, status, etag }) => ({ path, if_none_match, status, etag }))

step = 'dependency'
let mark = requests.length
summary.dependency_local = await client.getFeatureFlag('needs-base', 'user-1', {
  ...quiet,
  onlyEvaluateLocally: true,
})
summary.dependency_local_off = await client.getFeatureFlag('needs-off', 'user-1', {
  ...quiet,
  onlyEvaluateLocally: true,
})
summary.dependency_local_paths = requests.slice(mark).map((r) => r.path)
mark = requests.length
summary.dependency = await client.getFeatureFlag('needs-base', 'user-1', quiet)
summary.dependency_paths = requests.slice(mark).map((r) => r.path)

step = 'remote config payload'
mark = requests.length
summary.payload = await client.getRemoteConfigPayload('settings')
// PostHog answers an unknown or plain flag with an empty 404; what the SDK makes of
// it (a throw, or a value handed to the app) is what the test checks.
summary.payload_missing = await outcome(() => client.getRemoteConfigPayload('no-such-flag'))
summary.payload_plain = await outcome(() => client.getRemoteConfigPayload('base'))
summary.payload_requests = requests
  .slice(mark)
  .map(({ method, path, query, status }) => ({ method, path, query, status }))

// Remote evaluation reports when the server evaluated: the $feature_flag_called
// event carries it as $feature_flag_evaluated_at (5.x).
step = 'evaluated at'
const remote = new PostHog(key, {
  host,
  fetch: recordingFetch,
  flushAt: 100,
  flushInterval: 60_000,
  requestTimeout: 5_000,
  fetchRetryCount: 0,
})
mark = requests.length
summary.remote_base = await remote.getFeatureFlag('base', 'remote-user')
await remote.shutdown(5_000)
summary.remote_evaluated_at = requests
  .slice(mark)
  .filter((r) => 'evaluated_at' in r)
  .map((r) => r.evaluated_at)

step = 'shutdown'
await client.shutdown(5_000)
clearTimeout(watchdog)
console.log(JSON.stringify(summary))
