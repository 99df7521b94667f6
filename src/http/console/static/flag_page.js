// Flag page (#/flag/<id>): one flag's rules in words, its exposures by variant over
// time, the stored persons it reaches now, and its change history from the activity
// log; switching it on or off asks first, as on the list. #/flag/new and
// #/flag/<id>/edit are the form (flag_form.js).
'use strict'
;(() => {
  const h = FP.h
  const WORDS = {
    exact: 'is', is_not: 'is not', icontains: 'contains', not_icontains: 'does not contain',
    icontains_multi: 'contains any of', not_icontains_multi: 'contains none of',
    regex: 'matches the regex', not_regex: 'does not match the regex',
    gt: 'is greater than', gte: 'is at least', lt: 'is less than', lte: 'is at most',
    is_set: 'is set', is_not_set: 'is not set',
    is_date_exact: 'is the date', is_date_after: 'is a date after', is_date_before: 'is a date before',
    semver_eq: 'is version', semver_neq: 'is not version', semver_gt: 'is a version above',
    semver_gte: 'is version or above', semver_lt: 'is a version below', semver_lte: 'is version or below',
    semver_tilde: 'is a version compatible (~) with', semver_caret: 'is a version compatible (^) with',
    semver_wildcard: 'is a version matching',
  }

  const quoted = (v) => (typeof v === 'string' ? `"${v}"` : JSON.stringify(v))

  /** One property filter as a phrase: `plan is "pro" or "team"`. */
  function filterWords(p) {
    const op = p.operator || 'exact'
    if (p.type === 'cohort') return `${op === 'not_in' ? 'not in' : 'in'} cohort ${p.value}`
    if (p.type === 'flag') return `the flag ${p.key} evaluates to ${quoted(p.value)}`
    const who = p.type === 'group' ? `the group's ${p.key}` : p.key
    if (op === 'is_set' || op === 'is_not_set') return `${who} ${WORDS[op]}`
    const values = Array.isArray(p.value) ? p.value : [p.value]
    const list = values.map(quoted).join(op === 'is_not' ? ' nor ' : ' or ')
    return `${who} ${WORDS[op] || op} ${list}`
  }

  /** The release conditions as sentences, one per group. */
  function rulesInWords(flag) {
    const f = flag.filters || {}
    const aggregated = f.aggregation_group_type_index === undefined || f.aggregation_group_type_index === null
      ? 'users' : `groups of type ${f.aggregation_group_type_index}`
    const groups = (f.groups || []).map((g, i) => {
      const pct = g.rollout_percentage === null || g.rollout_percentage === undefined ? 100 : g.rollout_percentage
      const props = g.properties || []
      const who = props.length ? `${aggregated} where ${props.map(filterWords).join(' and ')}` : `all ${aggregated}`
      const variant = g.variant ? `, who get the variant ${quoted(g.variant)}` : ''
      return h('li', {}, `Group ${i + 1}: ${pct}% of ${who}${variant}.`)
    })
    const variants = (f.multivariate && f.multivariate.variants) || []
    return [
      groups.length ? h('ol', { id: 'flag-rules', class: 'plain' }, groups)
        : h('p', { id: 'flag-rules' }, 'No condition groups: off for everyone.'),
      variants.length ? h('p', { id: 'flag-variants' }, `Those matched are split into variants: ${variants.map((v) => `${v.key} ${v.rollout_percentage}%`).join(', ')}.`) : null,
      flag.active ? null : h('p', { class: 'muted' }, 'The flag is off: /decide leaves it out for everyone.'),
    ]
  }

  /** A change from the activity log as a line. */
  function changeWords(entry) {
    const changes = (entry.detail && entry.detail.changes) || []
    const what = changes.map((c) => (c.field
      ? `${c.field}: ${JSON.stringify(c.before)} → ${JSON.stringify(c.after)}`
      : c.action || '')).filter(Boolean)
    return h('li', {},
      h('time', { datetime: entry.created_at }, FP.fmt.time(entry.created_at)), ' · ',
      h('strong', {}, (entry.user && entry.user.first_name) || 'someone'), ` ${entry.activity}`,
      what.length ? h('ul', {}, what.map((w) => h('li', {}, h('code', {}, w)))) : null)
  }

  async function exposuresView(flag, box) {
    const range = h('select', { id: 'fx-range' },
      FP.RANGES.filter(([v]) => !['today', 'yesterday', 'custom'].includes(v)).map(([v, t]) => h('option', { value: v, selected: v === '7' }, t)))
    const plot = h('div', { class: 'chart', id: 'fx-chart', role: 'img', 'aria-label': `Exposures of ${flag.key} by value over time` })
    const table = h('div', { id: 'fx-numbers' })
    let chart = null
    FP.onLeave(() => { if (chart) chart.destroy(); chart = null })
    async function draw() {
      const { from, to } = FP.rangeOf(range.value)
      const q = new URLSearchParams({ key: flag.key, interval: 'day', from: from.toISOString(), to: to.toISOString() })
      const data = await FP.api('GET', `flag_exposures?${q}`)
      const values = Object.entries(data.values)
      if (chart) chart.destroy()
      chart = null
      if (!values.length) {
        plot.replaceChildren(h('p', { class: 'muted' }, 'No $feature_flag_called events for this flag in the range.'))
        table.replaceChildren()
        return
      }
      chart = FP.chart(plot, data.buckets, data.interval_seconds, values.map(([v, n]) => ({ label: v, values: n })))
      table.replaceChildren(h('div', { class: 'table-wrap' }, h('table', {},
        h('caption', { class: 'muted' }, 'Exposures per day by the value returned, the chart\'s numbers'),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Day'), values.map(([v]) => h('th', { scope: 'col', class: 'num' }, v)))),
        h('tbody', {}, data.buckets.map((b, i) => h('tr', {},
          h('th', { scope: 'row' }, FP.fmt.bucket(b, data.interval_seconds)),
          values.map(([v, n]) => h('td', { class: 'num', 'data-value': v }, FP.fmt.int(n[i])))))))))
    }
    range.addEventListener('change', () => draw().catch((err) => table.replaceChildren(FP.errorBox(err.message))))
    box.replaceChildren(h('div', {}, h('label', { for: 'fx-range' }, 'Range'), range), plot, table)
    await draw()
  }

  async function reachView(flag, box) {
    const r = await FP.api('GET', `flag_reach?key=${encodeURIComponent(flag.key)}`)
    const share = r.scanned ? Math.round((1000 * r.reached) / r.scanned) / 10 : 0
    FP.fill(box,
      h('p', { id: 'flag-reach' }, `${FP.fmt.int(r.reached)} of ${FP.fmt.count(r.scanned, 'stored person', 'stored persons')} (${share}%) get it now.`),
      r.complete ? null : h('p', { class: 'muted' }, 'Only part of the persons was evaluated (a sample in id order); the share estimates the whole.'),
      h('p', { id: 'flag-reach-age', class: 'muted' }, `Counted ${r.age_seconds < 60 ? FP.fmt.count(r.age_seconds, 'second', 'seconds') : FP.fmt.count(Math.floor(r.age_seconds / 60), 'minute', 'minutes')} ago (${FP.fmt.time(r.counted_at)})${r.recounting ? '; persons changed since, counting again in the background' : ''}.`),
      Object.keys(r.values).length > 1 || (Object.keys(r.values)[0] || 'true') !== 'true'
        ? h('ul', { id: 'flag-reach-values' }, Object.entries(r.values).map(([v, n]) => h('li', {}, `${v}: ${FP.fmt.int(n)}`))) : null,
      r.examples.length ? h('ul', { id: 'flag-reach-examples' }, r.examples.map((p) => {
        const d = p.distinct_ids[p.distinct_ids.length - 1]
        return h('li', {}, h('a', { href: `#/persons/${encodeURIComponent(d)}` }, d))
      })) : null)
  }

  async function render(main, [which, sub]) {
    if ((which === 'new' || sub === 'edit') && FP.syncedFrom()) {
      return main.replaceChildren(h('p', { class: 'notice' }, `These flags are synced from ${FP.syncedFrom()}; change them there.`))
    }
    if (which === 'new' || sub === 'edit') return FP.flagForm(main, [which])
    const flag = await FP.api('GET', `feature_flags/${encodeURIComponent(which)}/`)
    FP.title(flag.key)
    const status = h('p', { role: 'status', 'aria-live': 'polite', class: 'notice' })
    if (FP.flash) { status.textContent = FP.flash; FP.flash = null }
    const rules = h('div', {}, rulesInWords(flag))
    const toggle = FP.flagSwitch(flag, status, () => FP.fill(rules, rulesInWords(flag)))
    const remove = h('button', { type: 'button', class: 'danger' }, 'Delete')
    remove.addEventListener('click', () => FP.confirmDelete(flag, status, remove))
    const exposures = h('div', { id: 'flag-exposures' })
    const reach = h('div', { id: 'flag-reach-box' }, h('p', { class: 'muted' }, 'Evaluating…'))
    // The history is PostHog's activity log, which a scoped key reads only with
    // activity_log:read: without it the rest of the page still shows.
    const history = await FP.api('GET', `feature_flags/${flag.id}/activity/?limit=20`)
      .catch((err) => { if (err.status === 403) return { denied: err.message }; throw err })
    FP.fill(main,
      h('p', {}, h('a', { href: '#/flags' }, '← All flags')),
      h('h1', {}, h('code', {}, flag.key)),
      flag.name ? h('p', {}, flag.name) : null,
      status,
      FP.syncedFrom()
        ? h('p', { class: 'notice', id: 'synced-from' }, `${flag.active ? 'On' : 'Off'}. Read-only: synced from `, h('code', {}, FP.syncedFrom()), '; change it there.')
        : h('div', { class: 'toolbar' }, h('span', { id: 'flag-switch-label' }, 'Enabled'), toggle,
          h('a', { href: `#/flag/${flag.id}/edit`, class: 'button' }, 'Edit'), remove),
      h('h2', {}, 'Who gets it'), rules,
      h('h2', {}, 'People it reaches now'), reach,
      h('h2', {}, 'Exposures by value over time'), exposures,
      h('h2', {}, 'Change history'),
      history.denied ? h('p', { class: 'muted', id: 'flag-history' }, history.denied)
        : history.results.length
        ? h('ul', { id: 'flag-history' }, history.results.map(changeWords))
        : h('p', { class: 'muted', id: 'flag-history' }, 'No changes through the API or the console yet.'),
      history.next ? h('p', { class: 'muted' }, `The ${history.results.length} newest of ${FP.fmt.int(history.total_count)} changes.`) : null)
    await Promise.all([
      exposuresView(flag, exposures),
      reachView(flag, reach).catch((err) => reach.replaceChildren(FP.errorBox(err.message))),
    ])
  }

  FP.pages.flag = { id: 'flags', title: 'Flag', render }
})()
