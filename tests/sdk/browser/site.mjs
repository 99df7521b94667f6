// A site that loads posthog-js from a flagpost server, in a real headless Chromium, with
// the project's optional features switched on in flagpost's settings (none in the
// page). Prints a JSON summary of what happened on stdout.
//
//     node site.mjs API_HOST PROJECT_KEY SCENARIO [WAY...]
//
// The site (a static server on 127.0.0.1:0) has one page per way sites load posthog-js:
//   snippet  PostHog's HTML snippet, which loads <api_host>/static/array.js
//   npm      the npm package's ES module build, extensions lazy-loaded from <api_host>
//   full     array.full.js served by the site, external dependency loading left on
// Scenarios, each in fresh browser contexts:
//   plain         each way loads and settles; nothing else happens
//   autocapture   on each way: a click on a button that does nothing, then wait for
//                 the heatmap, dead click and web vitals events
//   exception     on each way: an uncaught error thrown by the page
//   survey        the popover survey shows; answer it; reload and it is not shown again
//   early-access  list the early access features, enroll; posthog-js reloads the flags
// Naming ways limits plain, autocapture and exception to them (for a look at one).
// Every request of every context is recorded with its answer, and every console error
// and uncaught exception, so the test can say none failed.

import { readFileSync } from 'node:fs'

import {
  POSTHOG_JS,
  POSTHOG_JS_VERSION,
  WAIT_MS,
  failures,
  launch,
  record,
  servePages,
  sleep,
  until,
  watchdog,
  within,
} from './chromium.mjs'

const [apiHost, token, scenario, ...only] = process.argv.slice(2)
const WAYS = only.length ? only : ['snippet', 'npm', 'full']
/** The button that does nothing, at a fixed place: its centre, in page pixels. */
const BUTTON = { x: 120, y: 220 }
/** With nothing in flight for this long after the page's work, the load has settled. */
const QUIET_MS = 1500

const run = watchdog(100_000)

const site = new URL('site/', import.meta.url)
const body = readFileSync(new URL('body.html', site), 'utf8')
const page = (way) => () => [
  'text/html',
  readFileSync(new URL(`${way}.html`, site), 'utf8')
    .replaceAll('{{API_HOST}}', apiHost)
    .replaceAll('{{TOKEN}}', token)
    .replace('{{BODY}}', body),
]
const dist = (file) => () => ['text/javascript', readFileSync(new URL(`dist/${file}`, POSTHOG_JS))]
const pages = await servePages({
  '/snippet.html': page('snippet'),
  '/npm.html': page('npm'),
  '/full.html': page('full'),
  '/node_modules/posthog-js/dist/module.js': dist('module.js'),
  '/node_modules/posthog-js/dist/array.full.js': dist('array.full.js'),
})

/** Wait until posthog-js is initialised and has its flags. */
async function loaded(tab) {
  await until('posthog-js to load', () => tab.evaluate(() => !!window.posthog?.__loaded))
  await within(
    'the flags',
    tab.evaluate(() => new Promise((resolve) => posthog.onFeatureFlags(() => resolve())))
  )
}

/** Wait until the page has nothing in flight and has asked for nothing for a while. */
async function quiet(log) {
  let count = -1
  let since = Date.now()
  await until('the page to go quiet', () => {
    if (log.requests.length !== count || !log.settled()) {
      count = log.requests.length
      since = Date.now()
    }
    return Date.now() - since >= QUIET_MS
  })
}

/** Wait until an event of that name has been sent and answered; returns it. */
async function sent(log, name) {
  await until(`a ${name} event`, () => log.sent().some((e) => e.event === name))
  await until('every request to finish', () => log.settled())
  return log.sent().find((e) => e.event === name)
}

/** The log of each context opened, by page: printed if the scenario fails. */
const opened = []

/** `fn(way)` for every way at once, each in its own context; results by way. */
async function eachWay(fn) {
  run.step = `${scenario} on ${WAYS.join(', ')}`
  return Object.fromEntries(await Promise.all(WAYS.map(async (way) => [way, await fn(way)])))
}

/** A fresh context on a way's page; `query` is added to its URL. */
async function open(browser, way, query = '') {
  const context = await browser.newContext({ viewport: { width: 800, height: 600 } })
  context.setDefaultTimeout(WAIT_MS)
  const log = await record(context, apiHost)
  opened.push({ way, log })
  const tab = await context.newPage()
  await tab.goto(`${pages.origin}/${way}.html${query}`)
  return { context, log, tab, url: tab.url() }
}

/** The server's answer to the last flags request. */
function lastFlags(log) {
  return log.requests.filter((r) => r.path.startsWith('/flags')).at(-1)?.response ?? null
}

/** What the test reads of a context's log. */
function report(log) {
  return {
    requests: log.requests.map(({ method, url, path, query, status, failure, events }) => ({
      method,
      url,
      path,
      query,
      status,
      failure,
      events,
    })),
    flags: lastFlags(log),
    failures: failures(log),
    console_errors: [...log.console_errors],
    page_errors: [...log.page_errors],
  }
}

const scenarios = {
  // Each way loads, sends its pageview, fetches its flags, config, surveys and
  // extensions, and goes quiet. Then the visitor leaves, and posthog-js sends what it
  // still holds (the page leave, web vitals) with sendBeacon: Chromium does not show
  // those requests to Playwright once the page is gone, so the test looks for their
  // events on the server.
  async plain(browser) {
    return eachWay(async (way) => {
      const { context, log, tab, url } = await open(browser, way)
      await loaded(tab)
      const pageview = await sent(log, '$pageview')
      await quiet(log)
      const out = { url, pageview, ...report(log) }
      await tab.goto('about:blank')
      await quiet(log)
      await context.close()
      return out
    })
  },

  // On each way at once: a click on a button that does nothing, which makes an
  // autocapture event, a heatmap click and, once nothing changed for the dead-click
  // wait, a dead click. Web vitals go out a few seconds after the first paint.
  async autocapture(browser) {
    return eachWay(async (way) => {
      const { context, log, tab, url } = await open(browser, way)
      await loaded(tab)
      await sent(log, '$pageview')
      // The extensions may be lazy: wait for dead clicks to be watching.
      await until(`the dead clicks extension (${way})`, () =>
        tab.evaluate(() => !!window.__PosthogExtensions__?.initDeadClicksAutocapture)
      )
      // And for the load to be over: a page that changes within a few seconds of a
      // click (the survey's popover showing, were it not kept to its own page) makes
      // it a live click, not a dead one.
      await quiet(log)
      await tab.mouse.click(BUTTON.x, BUTTON.y)
      const events = {}
      for (const name of ['$autocapture', '$dead_click', '$$heatmap', '$web_vitals']) {
        events[name] = await sent(log, name)
      }
      await quiet(log)
      const out = { url, button: BUTTON, events, ...report(log) }
      await context.close()
      return out
    })
  },

  // On each way at once: an error nobody catches, once exception autocapture is on.
  async exception(browser) {
    return eachWay(async (way) => {
      const { context, log, tab, url } = await open(browser, way)
      await loaded(tab)
      await until(`exception autocapture (${way})`, () =>
        tab.evaluate(() => !!window.__PosthogExtensions__?.errorWrappingFunctions)
      )
      // The extension wraps window.onerror once its script has run; give it that turn.
      await sleep(200)
      await tab.evaluate(() => {
        setTimeout(() => {
          throw new Error('flagpost test: nobody catches this')
        })
      })
      const exception = await sent(log, '$exception')
      await quiet(log)
      const out = { url, exception, ...report(log) }
      await context.close()
      return out
    })
  },

  // The popover shows by itself; answer and submit it. Then forget that this browser
  // saw it (posthog-js remembers in localStorage) and reload: the survey must now be
  // held back by its internal targeting flag, which flagpost evaluates against the
  // person properties posthog-js sends with the flags request.
  async survey(browser) {
    run.step = 'survey load'
    // The survey's URL condition shows it on this page only.
    const { context, log, tab, url } = await open(browser, 'npm', '?with-survey')
    await loaded(tab)
    const surveys = await within(
      'the surveys',
      tab.evaluate(() => new Promise((resolve) => posthog.getSurveys((s) => resolve(s), true)))
    )
    if (surveys.length !== 1) throw new Error(`one survey expected: ${JSON.stringify(surveys)}`)
    const survey = surveys[0]
    const selector = `.PostHogSurvey-${survey.id}`
    run.step = 'survey shown'
    await tab.locator(`${selector} textarea`).waitFor()
    const renderable = () =>
      within('the survey check', tab.evaluate((id) => posthog.canRenderSurveyAsync(id, true), survey.id))
    const before = await renderable()
    await tab.locator(`${selector} textarea`).fill('flagpost answer')
    await tab.locator(`${selector} .form-submit`).click()
    run.step = 'survey sent'
    const sentEvent = await sent(log, 'survey sent')
    const flag = survey.internal_targeting_flag_key
    // posthog-js reloads the flags once the answer is sent, with the `$survey_responded`
    // person property: flagpost must then answer the internal targeting flag off.
    await until('the internal targeting flag to turn off', () =>
      tab.evaluate((key) => posthog.getFeatureFlag(key, { send_event: false }) === false, flag)
    )
    await quiet(log)
    const first = report(log)

    run.step = 'survey reload'
    await tab.evaluate(() => {
      for (const key of Object.keys(localStorage)) {
        if (key.startsWith('seenSurvey_') || key.startsWith('inProgressSurvey_')) localStorage.removeItem(key)
      }
    })
    const reloadStart = log.requests.length
    await tab.reload()
    await loaded(tab)
    await quiet(log)
    const after = await renderable()
    const rendered = await tab.locator(selector).count()
    const out = {
      url,
      survey,
      shown: log.sent().find((e) => e.event === 'survey shown') ?? null,
      sent: sentEvent,
      before,
      after,
      rendered_after_reload: rendered,
      flag_after_reload: await tab.evaluate((key) => posthog.getFeatureFlag(key, { send_event: false }), flag),
      ...first,
      reload: report({ ...log, requests: log.requests.slice(reloadStart) }),
    }
    await context.close()
    return out
  },

  // The early access features as posthog-js lists them; enrolling flips the feature's
  // flag, which flagpost must then agree with when the flags are reloaded.
  async 'early-access'(browser) {
    run.step = 'early access load'
    const { context, log, tab, url } = await open(browser, 'snippet')
    await loaded(tab)
    const features = await within(
      'the early access features',
      tab.evaluate(() => new Promise((resolve) => posthog.getEarlyAccessFeatures((f) => resolve(f), true)))
    )
    if (features?.length !== 1) throw new Error(`one feature expected: ${JSON.stringify(features)}`)
    const flag = features[0].flagKey
    const before = await tab.evaluate((key) => posthog.getFeatureFlag(key, { send_event: false }), flag)
    // The load's own flags requests are over before enrolling, so the one after it is
    // the test's.
    await quiet(log)
    run.step = 'early access enroll'
    const flagsRequests = () => log.requests.filter((r) => r.path.startsWith('/flags')).length
    const requestsBefore = flagsRequests()
    await tab.evaluate((key) => posthog.updateEarlyAccessFeatureEnrollment(key, true), flag)
    const enrollment = await sent(log, '$feature_enrollment_update')
    // posthog-js turns the flag on locally at once, and the enrollment's `$set` makes it
    // reload the flags with the new person property: the server's answer to that
    // request is what the test reads.
    await until('the flags to be reloaded', () => flagsRequests() > requestsBefore && log.settled())
    await quiet(log)
    const out = {
      url,
      features,
      flag,
      before,
      enrollment,
      after: lastFlags(log)?.flags?.[flag] ?? null,
      flags_requests: flagsRequests() - requestsBefore,
      ...report(log),
    }
    await context.close()
    return out
  },
}

if (!scenarios[scenario]) {
  console.error(`unknown scenario ${scenario}; one of ${Object.keys(scenarios).join(', ')}`)
  process.exit(2)
}
const browser = await launch()
const summary = { sdk: 'posthog-js', version: POSTHOG_JS_VERSION, chromium: browser.version(), scenario }
try {
  summary.result = await scenarios[scenario](browser)
} catch (e) {
  // Say what the page saw on the way to the failure: it usually names the cause.
  for (const { way, log } of opened) {
    const seen = log.requests.map((r) => `${r.method} ${r.url} ${r.failure ?? r.status}`)
    console.error(`${way} requests:\n  ${seen.join('\n  ')}`)
    console.error(`${way} console errors: ${JSON.stringify(log.console_errors)}`)
    console.error(`${way} uncaught: ${JSON.stringify(log.page_errors)}`)
  }
  throw e
} finally {
  await browser.close()
  pages.close()
}
run.done()
console.log(JSON.stringify(summary))
