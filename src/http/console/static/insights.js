// Insights page: event counts over time (hour or day buckets; 24 h to 90 days;
// several events; total or unique persons) drawn with the vendored uPlot, with the
// same numbers in a table; the top events of the range; flag exposures by variant;
// survey responses.
'use strict'
;(() => {
  const h = FP.h
  const RANGES = [['24', '24 hours'], ['168', '7 days'], ['720', '30 days'], ['2160', '90 days']]
  const COLOURS = ['#0b57d0', '#b45309', '#116329', '#9d174d', '#5b21b6', '#0e7490', '#4d7c0f', '#7c2d12', '#1e3a8a', '#701a75']
  let chart = null

  function select(idName, label, options, value) {
    const el = h('select', { id: idName }, options.map(([v, t]) => h('option', { value: v, selected: v === value }, t)))
    return [el, h('div', {}, h('label', { for: idName }, label), el)]
  }

  async function render(main) {
    const top = await FP.api('GET', 'insights/top?hours=168')
    const guess = top.events.slice(0, 2).map((e) => e.event).join(', ') || '$pageview'
    const events = h('input', { id: 'in-events', value: guess, autocomplete: 'off', 'aria-describedby': 'in-events-help' })
    const [range, rangeBox] = select('in-range', 'Range', RANGES, '168')
    const [interval, intervalBox] = select('in-interval', 'Interval', [['hour', 'Hour'], ['day', 'Day']], 'day')
    const [measure, measureBox] = select('in-measure', 'Count', [['total', 'Total events'], ['unique', 'Unique persons']], 'total')
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
      h('p', { id: 'in-events-help', class: 'muted' }, 'Event names separated by commas, up to 10.'))

    async function draw() {
      status.replaceChildren()
      const names = events.value.split(',').map((s) => s.trim()).filter(Boolean)
      const q = new URLSearchParams({ hours: range.value, interval: interval.value })
      for (const n of names) q.append('event', n)
      const data = await FP.api('GET', `insights/counts?${q}`)
      if (!data.rollups.ready) {
        status.replaceChildren(h('p', { class: 'muted', id: 'in-rollups' },
          `Rollups being built (${data.rollups.percent}%): counted from the stored events meanwhile, which is slower.`))
      }
      const key = measure.value
      const xs = data.buckets.map((t) => Date.parse(t) / 1000)
      if (chart) chart.destroy()
      plot.replaceChildren()
      chart = new uPlot({
        width: Math.max(280, plot.clientWidth || main.clientWidth - 32),
        height: 320,
        series: [{}, ...data.series.map((s, i) => ({ label: s.event, stroke: COLOURS[i % COLOURS.length], width: 2 }))],
        axes: [{}, { size: 60 }],
        scales: { x: { time: true } },
      }, [xs, ...data.series.map((s) => s[key])], plot)
      numbers.replaceChildren(h('div', { class: 'table-wrap' }, h('table', {},
        h('caption', { class: 'muted' }, key === 'total'
          ? `Events per ${interval.value}, the chart's numbers`
          : `Unique persons per ${interval.value}, the chart's numbers (exact up to 128 a bucket, then an estimate within about 3%)`),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Event'), h('th', { scope: 'col', class: 'num' }, 'Whole range'),
          h('th', { scope: 'col', class: 'num' }, 'Busiest bucket'))),
        h('tbody', {}, data.series.map((s) => h('tr', { 'data-event': s.event },
          h('td', {}, h('code', {}, s.event)),
          h('td', { class: 'num', 'data-total': s.total.reduce((a, b) => a + b, 0) },
            FP.fmt.int(s[key].reduce((a, b) => a + b, 0))),
          h('td', { class: 'num' }, FP.fmt.int(Math.max(0, ...s[key])))))))))
      const hours = range.value
      const [tops, exposures, surveys] = await Promise.all([
        FP.api('GET', `insights/top?hours=${hours}`),
        FP.api('GET', `exposures?hours=${hours}`),
        FP.api('GET', `insights/surveys?hours=${hours}`),
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
        h('strong', {}, s.name), ` ${FP.fmt.int(s.responses)} responses`,
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
