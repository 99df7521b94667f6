// Insights page: event counts over time (hour or day buckets; today, yesterday, the
// last 7, 30 or 90 days or a custom range of local days; several events; total or
// unique persons) drawn with the vendored uPlot, with every bucket's numbers in a table
// and the whole range's: its unique persons are the union of the buckets' (the server
// merges the hours' sketches), never their sum. Then the top events of the range, flag
// exposures by variant and survey responses.
'use strict'
;(() => {
  const h = FP.h
  let chart = null

  function select(idName, label, options, value) {
    const el = h('select', { id: idName }, options.map(([v, t]) => h('option', { value: v, selected: v === value }, t)))
    return [el, h('div', {}, h('label', { for: idName }, label), el)]
  }

  /** Every bucket's numbers, then the whole range's, one column per event. */
  function numbersTable(data, key, interval) {
    const series = data.series
    const measure = key === 'total' ? 'Events' : 'Unique persons'
    return h('div', { class: 'table-wrap' }, h('table', { id: 'in-table' },
      h('caption', { class: 'muted' }, key === 'total'
        ? `Events per ${interval}, the chart's numbers`
        : `Unique persons per ${interval}, the chart's numbers; the whole range counts each person once (exact up to 128, then an estimate within about 3%)`),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, interval === 'hour' ? 'Hour' : 'Day'),
        series.map((s) => h('th', { scope: 'col', class: 'num' }, h('code', {}, s.event))))),
      h('tbody', {}, data.buckets.map((b, i) => h('tr', { 'data-bucket': b },
        h('th', { scope: 'row' }, FP.fmt.bucket(b, data.interval_seconds)),
        series.map((s) => h('td', { class: 'num' }, FP.fmt.int(s[key][i])))))),
      h('tfoot', {}, h('tr', {},
        h('th', { scope: 'row' }, `Whole range (${measure.toLowerCase()})`),
        series.map((s) => h('td', { class: 'num', 'data-event': s.event, 'data-total': s.range_total, 'data-unique': s.range_unique },
          h('strong', {}, FP.fmt.int(key === 'total' ? s.range_total : s.range_unique))))))))
  }

  async function render(main) {
    const top = await FP.api('GET', 'insights/top?hours=168')
    const guess = top.events.slice(0, 2).map((e) => e.event).join(', ') || '$pageview'
    const events = h('input', { id: 'in-events', value: guess, autocomplete: 'off', 'aria-describedby': 'in-events-help' })
    const [range, rangeBox] = select('in-range', 'Range', FP.RANGES, '7')
    const first = h('input', { id: 'in-first', type: 'date' })
    const last = h('input', { id: 'in-last', type: 'date' })
    const custom = h('div', { class: 'row', hidden: true },
      h('div', {}, h('label', { for: 'in-first' }, 'First day'), first),
      h('div', {}, h('label', { for: 'in-last' }, 'Last day'), last))
    const [interval, intervalBox] = select('in-interval', 'Interval', [['hour', 'Hour'], ['day', 'Day']], 'day')
    const [measure, measureBox] = select('in-measure', 'Count', [['total', 'Total events'], ['unique', 'Unique persons']], 'total')
    range.addEventListener('change', () => {
      custom.hidden = range.value !== 'custom'
      // A day's range reads best by the hour.
      interval.value = range.value === 'today' || range.value === 'yesterday' ? 'hour' : 'day'
    })
    const plot = h('div', { class: 'chart', id: 'in-chart', role: 'img', 'aria-label': 'Event counts over time' })
    const numbers = h('div', { id: 'in-numbers' })
    const status = h('div', { 'aria-live': 'polite' })
    const topBox = h('div', { id: 'in-top' })
    const exposureBox = h('div', { id: 'in-exposures' })
    const surveyBox = h('div', { id: 'in-surveys' })
    const form = h('form', { class: 'card', 'aria-label': 'Chart settings' },
      h('div', { class: 'row' },
        h('div', {}, h('label', { for: 'in-events' }, 'Events'), events),
        rangeBox, intervalBox, measureBox,
        h('div', {}, h('button', { type: 'submit', class: 'primary' }, 'Show'))),
      custom,
      h('p', { id: 'in-events-help', class: 'muted' }, 'Event names separated by commas, up to 10. Days are your browser\'s local days.'))

    async function draw() {
      status.replaceChildren()
      const names = events.value.split(',').map((s) => s.trim()).filter(Boolean)
      const { from, to } = FP.rangeOf(range.value, first.value, last.value)
      const span = { from: from.toISOString(), to: to.toISOString() }
      const q = new URLSearchParams({ ...span, interval: interval.value })
      for (const n of names) q.append('event', n)
      const data = await FP.api('GET', `insights/counts?${q}`)
      if (!data.rollups.ready) {
        status.replaceChildren(h('p', { class: 'muted', id: 'in-rollups' },
          `Rollups being built (${data.rollups.percent}%): counted from the stored events meanwhile, which is slower.`))
      }
      const key = measure.value
      if (chart) chart.destroy()
      chart = FP.chart(plot, data.buckets, data.interval_seconds, data.series.map((s) => ({ label: s.event, values: s[key] })))
      numbers.replaceChildren(numbersTable(data, key, interval.value))
      const spanQ = new URLSearchParams(span)
      const [tops, exposures, surveys] = await Promise.all([
        FP.api('GET', `insights/top?${spanQ}`),
        FP.api('GET', `exposures?${spanQ}`),
        FP.api('GET', `insights/surveys?${spanQ}`),
      ])
      const most = Math.max(1, ...tops.events.map((e) => e.count))
      topBox.replaceChildren(tops.events.length ? h('ol', {}, tops.events.map((e) => h('li', {},
        h('code', {}, e.event), ` ${FP.fmt.int(e.count)} `,
        h('span', { class: 'bar', style: null, 'aria-hidden': 'true', 'data-width': Math.round((100 * e.count) / most) })))) : h('p', { class: 'muted' }, 'No events in this range.'))
      for (const bar of topBox.querySelectorAll('.bar')) bar.style.width = `${bar.dataset.width / 10}rem`
      const flags = Object.entries(exposures.flags)
      exposureBox.replaceChildren(flags.length ? h('div', { class: 'table-wrap' }, h('table', {},
        h('caption', { class: 'muted' }, '$feature_flag_called events by the value returned'),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Flag'), h('th', { scope: 'col' }, 'Value'), h('th', { scope: 'col', class: 'num' }, 'Exposures'))),
        h('tbody', {}, flags.flatMap(([flag, values]) => Object.entries(values).map(([v, n]) =>
          h('tr', {}, h('td', {}, h('code', {}, flag)), h('td', {}, v), h('td', { class: 'num' }, FP.fmt.int(n)))))))) : h('p', { class: 'muted' }, 'No flag was called in this range.'))
      surveyBox.replaceChildren(surveys.surveys.length ? h('ul', {}, surveys.surveys.map((s) => h('li', {},
        h('strong', {}, s.name), ` ${FP.fmt.count(s.responses, 'response', 'responses')}`,
        h('ul', {}, Object.entries(s.answers).map(([a, n]) => h('li', {}, `${a}: ${FP.fmt.int(n)}`)))))) : h('p', { class: 'muted' }, 'No survey responses in this range.'))
    }
    form.addEventListener('submit', (ev) => {
      ev.preventDefault()
      draw().catch((err) => status.replaceChildren(FP.errorBox(err.message)))
    })
    main.replaceChildren(h('h1', {}, 'Insights'), form, status, plot, numbers,
      h('h2', {}, 'Top events'), topBox,
      h('h2', {}, 'Flag exposures by variant'), exposureBox,
      h('h2', {}, 'Survey responses'), surveyBox)
    FP.onLeave(() => { if (chart) chart.destroy(); chart = null })
    await draw()
  }

  FP.pages.insights = { id: 'insights', title: 'Insights', render }
})()
