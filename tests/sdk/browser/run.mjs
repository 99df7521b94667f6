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
import http from 'node:http'
import { createRequire } from 'node:module'
import { gunzipSync } from 'node:zlib'

const deps = new URL('../node/', import.meta.url)
const { chromium } = createRequire(new URL('package.json', deps))('playwright-core')
const POSTHOG_JS = new URL('node_modules/posthog-js/dist/array.full.js', deps)
const version = JSON.parse(readFileSync(new URL('node_modules/posthog-js/package.json', deps))).version
const PAGE = new URL('page.html', import.meta.url)

const [apiHost, token, prefix] = process.argv.slice(2)
// Headless, and nothing in the background: without --disable-background-networking
// and the rest, Chromium tries to reach Google. Even with them it still looks up
// update.googleapis.com and accounts.google.com, so no name resolves at all: the test
// uses 127.0.0.1 only. Playwright adds a fresh --user-data-dir on every launch.
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1',
]
const WAIT_MS = 20_000

// Bound the whole run: the test harness kills us too, but this says where we were.
let step = 'start'
const watchdog = setTimeout(() => {
  console.error(`timed out; last step: ${step}`)
  process.exit(2)
}, 100_000)

const pages = http.createServer((req, res) => {
  const path = new URL(req.url, 'http://x').pathname
  const [file, type] =
    path === '/posthog.js'
      ? [POSTHOG_JS, 'text/javascript']
      : path === '/'
        ? [PAGE, 'text/html']
        : [null, null]
  if (!file) return res.writeHead(404).end()
  res.writeHead(200, { 'Content-Type': type }).end(readFileSync(file))
})
await new Promise((resolve) => pages.listen(0, '127.0.0.1', resolve))
const pageOrigin = `http://127.0.0.1:${pages.address().port}`

const isLoopback = (url) => ['127.0.0.1', 'localhost', '[::1]'].includes(new URL(url).hostname)

// A body as the server must read it: gzip by its magic bytes, base64 in a form's
// `data`, else JSON.
function decode(body, contentType) {
  if (!body?.length) return { kind: 'empty', json: null }
  if (body[0] === 0x1f && body[1] === 0x8b) {
    return { kind: 'gzip', json: JSON.parse(gunzipSync(body).toString()) }
  }
  if ((contentType ?? '').startsWith('application/x-www-form-urlencoded')) {
    const data = new URLSearchParams(body.toString()).get('data')
    return { kind: 'base64', json: JSON.parse(Buffer.from(data, 'base64').toString()) }
  }
  return { kind: 'json', json: JSON.parse(body.toString()) }
}

// The events of an intake payload: an array of events or a batch object.
function eventsOf(payload) {
  const batch = Array.isArray(payload) ? payload : (payload.batch ?? [payload])
  return batch.map((e) => ({
    uuid: e.uuid ?? null,
    event: e.event,
    distinct_id: e.properties?.distinct_id ?? e.distinct_id ?? null,
  }))
}

async function until(what, fn) {
  const deadline = Date.now() + WAIT_MS
  while (!fn()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

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
  step = `visit ${mode}`
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
    const intake = /^\/(e|i\/v0\/e|batch|capture)\/?$/.test(url.pathname)
    const body = decode(req.postDataBuffer(), req.headers()['content-type'])
    const entry = {
      method: req.method(),
      url: req.url(),
      path: url.pathname,
      query: url.search.slice(1),
      content_type: req.headers()['content-type'] ?? null,
      body: body.kind,
      status: null,
      events: intake ? eventsOf(body.json) : [],
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
  step = `flags ${mode}`
  await page.evaluate(
    (ms) =>
      Promise.race([
        window.flagsLoaded,
        new Promise((_, reject) => setTimeout(() => reject(new Error('no flags')), ms)),
      ]),
    WAIT_MS
  )
  step = `actions ${mode}`
  const user = `${prefix}-${mode}-user`
  const company = `${prefix}-${mode}-acme`
  const result = await page.evaluate(actions, { user, company })
  // Every queued event is out once the last one is, and nothing is in flight.
  step = `flush ${mode}`
  const sent = () => requests.flatMap((r) => r.events.map((e) => e.uuid))
  await until('the last event to be sent', () => sent().includes(result.ids.done))
  await until('every request to finish', () => requests.every((r) => r.status !== null))
  await context.close()
  return { ...result, user, company, requests, blocked }
}

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: CHROMIUM_ARGS,
  timeout: WAIT_MS,
})
const summary = { sdk: 'posthog-js', version, chromium: browser.version(), visits: {} }
try {
  for (const mode of ['gzip', 'base64']) summary.visits[mode] = await visit(browser, mode)
} finally {
  await browser.close()
  pages.close()
}
clearTimeout(watchdog)
console.log(JSON.stringify(summary))
