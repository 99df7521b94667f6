// Drive posthog-js-lite in a real headless Chromium against a flagpost server and
// print a JSON summary of what it did on stdout.
//
//     node lite/browser.mjs API_HOST PROJECT_KEY PREFIX
//
// A static server on 127.0.0.1:0 serves page.html, scenario.mjs and the ES module
// builds of posthog-js-lite and @posthog/core from the installed npm packages (the
// page's import map names them). The scenario runs twice, each in a fresh browser
// context: with the client's default compression (gzip through the browser's
// CompressionStream) and with `disableCompression`. Every request the context makes
// is recorded with its decoded body and its answer, and every console error and
// uncaught exception; requests off loopback are aborted and so show up as failed.

import { readFileSync, readdirSync } from 'node:fs'

import { WAIT_MS, failures, launch, record, servePages, until, watchdog } from '../browser/chromium.mjs'

const [apiHost, token, prefix] = process.argv.slice(2)

const run = watchdog(100_000)

// npm ci installs both flat, @posthog/core once for every package that needs it.
const packageDir = (name) => new URL(`../node/node_modules/${name}/`, import.meta.url)
const version = (name) => JSON.parse(readFileSync(new URL('package.json', packageDir(name)))).version

/** Every file of a package's `dist/` (and below), at /node_modules/NAME/dist/... */
function distRoutes(name) {
  const dist = new URL('dist/', packageDir(name))
  const routes = {}
  for (const file of readdirSync(dist, { recursive: true })) {
    const type = file.endsWith('.mjs') || file.endsWith('.js') ? 'text/javascript' : 'application/json'
    if (!/\.(m?js|map)$/.test(file)) continue
    routes[`/node_modules/${name}/dist/${file}`] = () => [type, readFileSync(new URL(file, dist))]
  }
  return routes
}

const here = (file) => () => [
  file.endsWith('.html') ? 'text/html' : 'text/javascript',
  readFileSync(new URL(file, import.meta.url)),
]
const pages = await servePages({
  '/': here('page.html'),
  '/scenario.mjs': here('scenario.mjs'),
  ...distRoutes('posthog-js-lite'),
  ...distRoutes('@posthog/core'),
})

async function visit(browser, compression) {
  run.step = `visit ${compression}`
  const context = await browser.newContext()
  context.setDefaultTimeout(WAIT_MS)
  const log = await record(context, apiHost, { bodies: true })
  const warnings = []
  context.on('console', (m) => {
    if (m.type() === 'warning') warnings.push(m.text())
  })
  const page = await context.newPage()
  await page.goto(`${pages.origin}/`)
  await until('the page to load posthog-js-lite', () => page.evaluate(() => !!window.runScenario))
  run.step = `scenario ${compression}`
  const options = { host: apiHost, token, prefix: `${prefix}-${compression}`, compression }
  const result = await page.evaluate((o) => window.runScenario(o), options)
  run.step = `settle ${compression}`
  await until('every request to finish', () => log.settled())
  await context.close()
  // @posthog/core cancels the body of a successful write's answer unread, and
  // Chromium reports such a request as aborted (net::ERR_ABORTED) although its answer
  // came: those are kept apart, with the status the server gave, and are no failure
  // when that status is a success. Everything else that failed is one.
  const cancelled = (r) => r.failure === 'net::ERR_ABORTED' && r.answered >= 200 && r.answered < 300
  const api = log.requests.filter((r) => r.url.startsWith(apiHost))
  // Batches carry their events whole, flags requests their body; as node.mjs has them.
  const requests = api.map(({ payload, failure, answered, ...r }) => {
    if (cancelled({ failure, answered })) {
      r = { ...r, status: answered, failure: null, body_cancelled: true }
    } else {
      r = { ...r, failure }
    }
    if (r.path === '/batch/') return { ...r, events: payload?.batch ?? [] }
    return payload === undefined ? r : { ...r, request: payload }
  })
  return {
    ...result,
    requests,
    failures: failures({ requests: log.requests.filter((r) => !cancelled(r)) }),
    console_errors: log.console_errors,
    console_warnings: warnings,
    page_errors: log.page_errors,
  }
}

const browser = await launch()
const summary = {
  sdk: 'posthog-js-lite',
  version: version('posthog-js-lite'),
  core: version('@posthog/core'),
  chromium: browser.version(),
  runs: {},
}
try {
  for (const compression of ['on', 'off']) summary.runs[compression] = await visit(browser, compression)
} finally {
  await browser.close()
  pages.close()
}
run.done()
console.log(JSON.stringify(summary))
