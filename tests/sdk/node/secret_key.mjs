// posthog-node 5 configured with a project secret key (phs_...) as `secretKey`: loads
// the project's flag definitions and evaluates flags locally, never asking the server to
// evaluate. Prints a JSON summary on stdout, with every request it made.
//
//     node secret_key.mjs HOST PROJECT_KEY SECRET_KEY

import { readFileSync } from 'node:fs'
import { PostHog } from 'posthog-node'

const [host, key, secret] = process.argv.slice(2)
const version = JSON.parse(
  readFileSync(new URL('./node_modules/posthog-node/package.json', import.meta.url))
).version

const requests = []
async function recordingFetch(url, options) {
  const u = new URL(url)
  const auth = Object.entries(options.headers ?? {}).find(
    ([k]) => k.toLowerCase() === 'authorization'
  )
  const response = await fetch(url, options)
  requests.push({ path: u.pathname, authorization: auth?.[1] ?? null, status: response.status })
  return response
}

const client = new PostHog(key, {
  host,
  secretKey: secret,
  fetch: recordingFetch,
  featureFlagsPollingInterval: 600_000,
  flushAt: 100,
  requestTimeout: 5_000,
  fetchRetryCount: 0,
})
await client.reloadFeatureFlags()
const flags = {}
for (const name of ['always-on', 'never', 'pro-only', 'checkout']) {
  flags[name] =
    (await client.getFeatureFlag(name, 'local-user', {
      personProperties: { plan: 'pro' },
      onlyEvaluateLocally: true,
      sendFeatureFlagEvents: false,
    })) ?? null
}
await client.shutdown()
console.log(JSON.stringify({ sdk: 'posthog-node', version, flags, requests }))
