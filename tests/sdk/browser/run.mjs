// Drive posthog-js in a real headless Chromium against a flagpost server and print a
// JSON summary of what it did on stdout.
//
//     node run.mjs API_HOST PROJECT_KEY PREFIX
//
// A tiny static server on 127.0.0.1:0 serves page.html and posthog-js from the
// installed npm package. Two visits, each a fresh browser context: one with
// posthog-js's default compression (gzip-js), one with `disable_compression: true`
// (plain JSON, and base64 for beacons). Chromium's requests to API_HOST are recorded with
// the events in them (decoded the way the server must decode them); any request off
// loopback is aborted and reported.

import { readFileSync } from 'node:fs'

import { POSTHOG_JS, POSTHOG_JS_VERSION, WAIT_MS, decode, eventsOf, isIntake, isLoopback, launch, servePages, until, watchdog } from './chromium.mjs'

const PAGE = new URL('page.html', import.meta.url)

const [apiHost, token, prefix] = process.argv.slice(2)

const run = watchdog(100_000)

const pages = await servePages({
  '/': () => ['text/html', readFileSync(PAGE)],
  '/posthog.js': () => ['text/javascript', readFileSync(new URL('dist/array.full.js', POSTHOG_JS))],
})
const pageOrigin = pages.origin

// Runs in the page: what a visitor does. Playwright sends it over as source, so
// everything it uses is inside it.
async function actions({ user, company }) {
  // Poll a flag until the reload that identify/group triggers has landed.
  async function flagBecomes(key, value) {
    const deadline = Date.now() + 10_000
    while (posthog.getFeatureFlag(key, { send_event: false }) !== value) {
      if (Date.now() > deadline) throw new Error(`flag ${key} never became ${value}`)
      await new Promise((r) => setTimeout(r, 50))
    }
  }
  const anon = posthog.get_distinct_id()
  const flagsBefore = { 'pro-only': posthog.isFeatureEnabled('pro-only') }
  const custom = posthog.capture('clicked buy', { color: 'blue' })
  posthog.identify(user, { plan: 'pro', email: `${user}@example.com` })
  await flagBecomes('pro-only', true)
  posthog.group('company', company, { seats: 50, name: 'Acme' })
  await flagBecomes('big-orgs', true)
  const flags = {
    'always-on': posthog.isFeatureEnabled('always-on'),
    never: posthog.isFeatureEnabled('never'),
    'pro-only': posthog.isFeatureEnabled('pro-only'),
    checkout: posthog.getFeatureFlag('checkout'),
    'checkout payload': posthog.getFeatureFlagPayload('checkout'),
    'big-orgs': posthog.getFeatureFlag('big-orgs'),
  }
  // The unload path, sendBeacon, on demand.
  const beacon = posthog.capture('beacon', { n: 1 }, { transport: 'sendBeacon' })
  const done = posthog.capture('done')
  return {
    anon,
    distinct_id: posthog.get_distinct_id(),
    flags_before: flagsBefore,
    flags,
    ids: { 'clicked buy': custom.uuid, beacon: beacon.uuid, done: done.uuid },
  }
}

async function visit(browser, mode) {
  run.step = `visit ${mode}`
  const context = await browser.newContext()
  context.setDefaultTimeout(WAIT_MS)
  const requests = []
  const blocked = []
  await context.route(
    (url) => !isLoopback(url.href),
    (route) => {
      blocked.push(route.request().url())
      return route.abort()
    }
  )
  const seen = new Map()
  context.on('request', (req) => {
    if (!req.url().startsWith(apiHost)) return
    const url = new URL(req.url())
    const body = decode(req.postDataBuffer(), req.headers()['content-type'])
    const entry = {
      method: req.method(),
      url: req.url(),
      path: url.pathname,
      query: url.search.slice(1),
      content_type: req.headers()['content-type'] ?? null,
      body: body.kind,
      status: null,
      events: isIntake(url.pathname) ? eventsOf(body.json) : [],
    }
    seen.set(req, entry)
    requests.push(entry)
  })
  context.on('requestfinished', async (req) => {
    const entry = seen.get(req)
    if (entry) entry.status = (await req.response())?.status() ?? 0
  })
  context.on('requestfailed', (req) => {
    const entry = seen.get(req)
    if (entry) entry.status = `failed: ${req.failure()?.errorText}`
  })
  const page = await context.newPage()
  page.on('console', (m) => console.error(`[${mode}] console.${m.type()}: ${m.text()}`))
  page.on('pageerror', (e) => console.error(`[${mode}] page error: ${e}`))

  const query = new URLSearchParams({
    api_host: apiHost,
    token,
    compression: mode === 'base64' ? 'off' : 'on',
  })
  await page.goto(`${pageOrigin}/?${query}`)
  run.step = `flags ${mode}`
  await page.evaluate(
    (ms) =>
      Promise.race([
        window.flagsLoaded,
        new Promise((_, reject) => setTimeout(() => reject(new Error('no flags')), ms)),
      ]),
    WAIT_MS
  )
  run.step = `actions ${mode}`
  const user = `${prefix}-${mode}-user`
  const company = `${prefix}-${mode}-acme`
  const result = await page.evaluate(actions, { user, company })
  // Every queued event is out once the last one is, and nothing is in flight.
  run.step = `flush ${mode}`
  const sent = () => requests.flatMap((r) => r.events.map((e) => e.uuid))
  await until('the last event to be sent', () => sent().includes(result.ids.done))
  await until('every request to finish', () => requests.every((r) => r.status !== null))
  await context.close()
  return { ...result, user, company, requests, blocked }
}

const browser = await launch()
const summary = { sdk: 'posthog-js', version: POSTHOG_JS_VERSION, chromium: browser.version(), visits: {} }
try {
  for (const mode of ['gzip', 'base64']) summary.visits[mode] = await visit(browser, mode)
} finally {
  await browser.close()
  pages.close()
}
run.done()
console.log(JSON.stringify(summary))
