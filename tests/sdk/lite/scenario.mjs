// What an app does with posthog-js-lite, the same in Chromium (page.html imports this
// file) and in Node (node.mjs): flags on load, capture, identify with $set and
// $set_once, group, flag reloads until the server sees what was sent, opt-out and
// opt-in, reset, and explicit flushes. Returns what the client reported; the caller
// records the requests it made.
//
// The client flushes only when told (a large flushAt, no flush timer), so the test
// knows which batch holds which events: four flushes send four batches, and the one
// made while opted out sends nothing.

/** How long a wait for the server's answer may take. */
const WAIT_MS = 15_000

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** The flags the first `featureflags` event reports, through `onFeatureFlags`. */
function nextFlags(posthog) {
  return new Promise((resolve) => {
    const off = posthog.onFeatureFlags((flags) => {
      off()
      resolve(flags)
    })
  })
}

/** `reloadFeatureFlags` as a promise of the flags it loaded (undefined when it failed). */
function reload(posthog) {
  return new Promise((resolve, reject) =>
    posthog.reloadFeatureFlags({ cb: (err, flags) => (err ? reject(err) : resolve(flags)) })
  )
}

/**
 * Reload until `key` is `value`: the server applies what a flush sent a little later,
 * and only then evaluates the flag on the stored person or group.
 */
async function reloadUntil(posthog, key, value) {
  const deadline = Date.now() + WAIT_MS
  let reloads = 0
  for (;;) {
    const flags = await reload(posthog)
    reloads += 1
    if (flags?.[key] === value) return reloads
    if (Date.now() > deadline) {
      throw new Error(`flag ${key} never became ${value}; last flags ${JSON.stringify(flags)}`)
    }
    await sleep(100)
  }
}

/** Every flag of the rules, by the calls an app makes; the boolean and variant calls
 * send `$feature_flag_called` the first time a value is seen. */
function readFlags(posthog) {
  return {
    'always-on': posthog.isFeatureEnabled('always-on'),
    never: posthog.isFeatureEnabled('never'),
    'pro-only': posthog.getFeatureFlag('pro-only'),
    checkout: posthog.getFeatureFlag('checkout'),
    'big-orgs': posthog.getFeatureFlag('big-orgs'),
    'checkout payload': posthog.getFeatureFlagPayload('checkout'),
    'always-on payload': posthog.getFeatureFlagPayload('always-on'),
  }
}

/**
 * Run the scenario with the `PostHog` class of posthog-js-lite. `compression` is 'on'
 * (the client's default, gzip where the runtime has CompressionStream) or 'off'.
 * `step` is told what is being done, for a timeout to say where it was.
 */
export async function scenario(PostHog, { host, token, prefix, compression, step = () => {} }) {
  const user = `${prefix}-user`
  const company = `${prefix}-acme`
  step('load')
  const posthog = new PostHog(token, {
    host,
    flushAt: 100,
    flushInterval: 0,
    disableCompression: compression === 'off',
    fetchRetryDelay: 200,
  })
  // What the client reports as failed (a flags or batch request): none is the only
  // good answer.
  const errors = []
  posthog.on('error', (e) => errors.push(String(e?.message ?? e)))
  const loaded = await nextFlags(posthog)
  const anon = posthog.getDistinctId()
  const before = readFlags(posthog)

  step('capture, identify')
  posthog.capture('clicked buy', { color: 'blue', items: [1, 2] })
  posthog.identify(user, {
    $set: { plan: 'pro', email: `${user}@example.com` },
    $set_once: { first_plan: 'pro' },
  })
  const identified = posthog.getDistinctId()
  await posthog.flush()
  const proReloads = await reloadUntil(posthog, 'pro-only', true)

  step('group')
  posthog.group('company', company, { seats: 50, name: 'Acme' })
  await posthog.flush()
  const groupReloads = await reloadUntil(posthog, 'big-orgs', true)
  const after = readFlags(posthog)
  posthog.capture('order placed', { amount: 30 })
  await posthog.flush()

  step('opt out')
  await posthog.optOut()
  const optedOut = posthog.optedOut
  posthog.capture('while opted out', { n: 1 })
  await posthog.flush()
  await posthog.optIn()
  const optedIn = !posthog.optedOut
  posthog.capture('opted in', { n: 2 })

  step('reset')
  posthog.reset()
  const fresh = posthog.getDistinctId()
  const resetFlags = await reload(posthog)
  const afterReset = readFlags(posthog)
  posthog.capture('after reset', { n: 3 })
  await posthog.flush()

  return {
    anon,
    user,
    company,
    identified,
    fresh,
    errors,
    opted_out: optedOut,
    opted_in: optedIn,
    reloads: { 'pro-only': proReloads, 'big-orgs': groupReloads },
    flags: { loaded, before, after, 'reset reload': resetFlags, 'after reset': afterReset },
  }
}
