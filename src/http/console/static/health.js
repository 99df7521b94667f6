// Health page: is the server keeping up? Log depth, compactor and sink lag, edge mode's
// forwarding (backlog, lag, dead letters, paused projects), free disk,
// files that failed to reload (with file and field), version and uptime; refreshed
// every few seconds while shown.
'use strict'
;(() => {
  const h = FP.h
  const REFRESH_MS = 5000

  function stat(label, value, ok) {
    return h('div', { class: 'stat' }, h('dl', {}, h('dt', {}, label),
      h('dd', { class: ok === undefined ? '' : ok ? 'good' : 'bad' }, value)))
  }

  // Edge mode: what the forwarder owes upstream; a paused project names itself.
  function upstream(u) {
    if (!u || !u.enabled) return []
    const paused = u.paused.map((p) => `project ${p.project}: ${p.reason}`).join('; ')
    return [
      stat('Upstream backlog', `${FP.fmt.int(u.backlog_events)} events, ${FP.fmt.bytes(u.backlog_bytes)}`, u.lag_seconds < 60),
      stat('Upstream lag', FP.fmt.seconds(u.lag_seconds), u.lag_seconds < 60 && u.retrying === 0),
      stat('Upstream dead letters', FP.fmt.int(u.dead_letters), u.dead_letters === 0),
      stat('Upstream paused projects', paused || 'none', !paused),
    ]
  }

  // Where a synced project's flags come from right now.
  const SERVING = {
    upstream: 'rules synced from upstream',
    stored: 'rules kept on disk',
    'flag file': 'its flag file, until upstream answers',
    nothing: 'no flags, until upstream answers',
    'quota limited': 'no flags (quota limited)',
  }

  /** Edge mode: each synced project's flag sync. */
  function syncView(up) {
    if (!up || !up.url) return []
    const rows = up.flag_sync.map((p) => h('tr', { 'data-project': p.project },
      h('th', { scope: 'row' }, String(p.project)),
      h('td', { class: p.quota_limited ? 'bad' : '' }, p.quota_limited ? `${p.last_status} (quota limited)` : p.last_status),
      h('td', { class: p.serving === 'upstream' || p.serving === 'stored' ? '' : 'bad' }, SERVING[p.serving] || p.serving),
      h('td', {}, p.last_success ? FP.fmt.time(new Date(p.last_success * 1000)) : 'never'),
      h('td', { class: p.age_seconds !== null && p.age_seconds < 300 ? 'good' : 'bad' }, p.age_seconds === null ? 'none' : FP.fmt.seconds(p.age_seconds)),
      h('td', { class: 'num' }, FP.fmt.int(p.failures_in_a_row)),
      h('td', {}, p.etag ? h('code', {}, p.etag) : '')))
    return [
      h('h2', {}, 'Flags synced from ', h('code', {}, up.url)),
      rows.length
        ? h('div', { class: 'table-wrap' }, h('table', { id: 'flag-sync' },
          h('thead', {}, h('tr', {}, ['Project', 'Last answer', 'Serving', 'Last success', 'Age', 'Failures in a row', 'ETag'].map((t) => h('th', { scope: 'col' }, t)))),
          h('tbody', {}, rows)))
        : h('p', { class: 'muted', id: 'flag-sync' }, 'No project has an upstream_secret_key.'),
    ]
  }

  function view(s) {
    const errors = s.reload_errors
    return [
      h('div', { class: 'grid', id: 'health-stats' },
        stat('Ready for traffic', s.ready ? 'yes' : 'no', s.ready),
        stat('Write-ahead log depth (records)', FP.fmt.int(s.log_depth), s.log_depth < 100000),
        stat('Write-ahead log size', s.log.backpressure
          ? `${FP.fmt.bytes(s.log.bytes)}: over ${FP.fmt.bytes(s.log.max_bytes)}, new events refused until the compactor catches up`
          : FP.fmt.bytes(s.log.bytes), !s.log.backpressure),
        stat('Compactor lag', FP.fmt.seconds(s.compactor.lag_seconds), s.compactor.healthy && s.compactor.lag_seconds < 60),
        stat('Compactor', s.compactor.healthy ? 'healthy' : 'failing', s.compactor.healthy),
        stat('ClickHouse sink lag', s.sink.enabled ? FP.fmt.seconds(s.sink.lag_seconds) : 'sink off',
          s.sink.enabled ? s.sink.lag_seconds < 60 : undefined),
        ...upstream(s.upstream),
        stat('Free disk', FP.fmt.bytes(s.disk.free_bytes), s.disk.free_bytes > s.disk.min_free_bytes),
        stat('Version', s.version),
        stat('Uptime', FP.fmt.seconds(s.uptime_seconds)),
        stat('Flag rules version', FP.fmt.int(s.flags_version))),
      ...syncView(s.upstream),
      h('h2', {}, 'Reload errors'),
      errors.length
        ? h('ul', { id: 'reload-errors' }, errors.map((e) => h('li', {}, h('strong', {}, `${e.of}: `), h('code', {}, e.problem))))
        : h('p', { class: 'good', id: 'reload-errors' }, 'Every file loaded.'),
    ]
  }

  async function render(main) {
    const body = h('div', { 'aria-live': 'off' })
    const stamp = h('p', { class: 'muted' })
    const refresh = async () => {
      const s = await FP.api('GET', 'health')
      body.replaceChildren(...view(s))
      stamp.textContent = `Updated ${FP.fmt.time(new Date())}; refreshes every ${REFRESH_MS / 1000} s.`
    }
    await refresh()
    main.replaceChildren(h('h1', {}, 'Health'), stamp, body)
    const timer = setInterval(() => refresh().catch((err) => { clearInterval(timer); stamp.replaceChildren(FP.errorBox(err.message)) }), REFRESH_MS)
    FP.onLeave(() => clearInterval(timer))
  }

  FP.pages.health = { id: 'health', title: 'Health', render }
})()
