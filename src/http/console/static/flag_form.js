// Flag form: create or edit one flag. The flag's `filters` object is the model: the
// form edits the parts it knows (condition groups, property filters, rollout,
// variants, payloads) and the JSON view shows and replaces the whole of it, so
// anything the form has no field for is kept. Saving sends it to the management API,
// whose validation errors are shown beside the field they name.
'use strict'
;(() => {
  const h = FP.h
  // Every operator a flag may use (PostHog's, as src/flags/vocabulary.rs lists them; a
  // test there keeps the two equal), with how its value is entered.
  const OPERATORS = [
    ['exact', 'equals one of', 'list'], ['is_not', 'equals none of', 'list'],
    ['icontains', 'contains', 'text'], ['not_icontains', 'does not contain', 'text'],
    ['icontains_multi', 'contains any of', 'list'], ['not_icontains_multi', 'contains none of', 'list'],
    ['regex', 'matches regex', 'text'], ['not_regex', 'does not match regex', 'text'],
    ['gt', '>', 'text'], ['gte', '≥', 'text'], ['lt', '<', 'text'], ['lte', '≤', 'text'],
    ['is_set', 'is set', 'none'], ['is_not_set', 'is not set', 'none'],
    ['is_date_exact', 'date is', 'text'], ['is_date_after', 'date is after', 'text'],
    ['is_date_before', 'date is before', 'text'],
    ['semver_eq', 'version =', 'text'], ['semver_neq', 'version ≠', 'text'],
    ['semver_gt', 'version >', 'text'], ['semver_gte', 'version ≥', 'text'],
    ['semver_lt', 'version <', 'text'], ['semver_lte', 'version ≤', 'text'],
    ['semver_tilde', 'version ~', 'text'], ['semver_caret', 'version ^', 'text'],
    ['semver_wildcard', 'version matches *', 'text'],
    ['in', 'in cohort', 'number'], ['not_in', 'not in cohort', 'number'],
    ['flag_evaluates_to', 'flag evaluates to', 'flag'],
  ]
  const KIND = Object.fromEntries(OPERATORS.map(([op, , kind]) => [op, kind]))
  let uid = 0
  const id = (p) => `${p}-${++uid}`

  /** The value as the API wants it for the operator, from what was typed. */
  function parseValue(op, text) {
    const kind = KIND[op] || 'text'
    if (kind === 'none') return op
    if (kind === 'list') return text.split(',').map((s) => s.trim()).filter(Boolean)
    if (kind === 'number') return /^\d+$/.test(text.trim()) ? Number(text.trim()) : text.trim()
    if (kind === 'flag') return text === 'true' ? true : text === 'false' ? false : text
    return text
  }
  function showValue(v) {
    if (Array.isArray(v)) return v.join(', ')
    if (v === null || v === undefined) return ''
    return String(v)
  }

  async function render(main, [which]) {
    const isNew = which === 'new'
    const flag = isNew
      ? { key: '', name: '', active: true, filters: { groups: [{ properties: [], rollout_percentage: 100 }] } }
      : await FP.api('GET', `feature_flags/${encodeURIComponent(which)}/`)
    const model = JSON.parse(JSON.stringify(flag.filters || {}))
    if (!Array.isArray(model.groups)) model.groups = []
    const errors = {}
    // The API names a condition group's field by its place (`groups[1].rollout_percentage
    // must be ...`): the message is shown in that group, its rollout marked invalid.
    const groupErrors = []
    const field = (name, label, input, help) => {
      errors[name] = h('div', { id: `${name}-error`, 'aria-live': 'polite' })
      input.setAttribute('aria-describedby', `${name}-error`)
      return h('div', {}, h('label', { for: input.id }, label), input, help || null, errors[name])
    }
    const key = h('input', { id: 'flag-key', name: 'key', required: true, value: flag.key, autocomplete: 'off', spellcheck: 'false' })
    const name = h('input', { id: 'flag-name', name: 'name', value: flag.name || '' })
    const active = h('input', { id: 'flag-active', type: 'checkbox', checked: flag.active })
    const groupsBox = h('div', {})
    const variantsBox = h('div', {})
    const json = h('textarea', { id: 'flag-json', rows: 14, spellcheck: 'false' })
    const formError = h('div', { 'aria-live': 'polite' })

    const sync = () => { json.value = JSON.stringify(model, null, 2) }
    const redraw = () => {
      groupErrors.length = 0
      groupsBox.replaceChildren(...model.groups.map((g, i) => groupView(g, i)), addGroupButton())
      variantsBox.replaceChildren(variantsView())
      sync()
    }
    const changed = () => sync()

    function addGroupButton() {
      return h('button', { type: 'button', onclick: () => {
        model.groups.push({ properties: [], rollout_percentage: 100 }); redraw()
      } }, 'Add condition group')
    }

    function groupView(g, i) {
      if (!Array.isArray(g.properties)) g.properties = []
      const rollId = id('rollout')
      const roll = h('input', { id: rollId, type: 'number', min: 0, max: 100, step: 'any', inputmode: 'decimal',
        value: g.rollout_percentage === null || g.rollout_percentage === undefined ? 100 : g.rollout_percentage })
      roll.addEventListener('input', () => { g.rollout_percentage = roll.value === '' ? null : Number(roll.value); changed() })
      const problem = h('div', { id: `group-${i}-error`, 'aria-live': 'polite' })
      roll.setAttribute('aria-describedby', problem.id)
      groupErrors[i] = { box: problem, rollout: roll }
      return h('fieldset', { 'data-group': i },
        h('legend', {}, `Condition group ${i + 1}`),
        g.properties.length ? g.properties.map((p, j) => propertyView(g, p, j, i)) : h('p', { class: 'muted' }, 'Matches everyone.'),
        h('div', { class: 'toolbar' },
          h('button', { type: 'button', onclick: () => {
            g.properties.push({ key: '', type: 'person', operator: 'exact', value: [] }); redraw()
          } }, 'Add property filter'),
          h('button', { type: 'button', class: 'danger', onclick: () => { model.groups.splice(i, 1); redraw() } },
            `Remove group ${i + 1}`)),
        h('div', { class: 'row' }, h('div', {}, h('label', { for: rollId }, 'Rollout percentage'), roll)),
        problem)
    }

    function propertyView(g, p, j, i) {
      const ids = { type: id('ptype'), key: id('pkey'), op: id('pop'), value: id('pvalue') }
      const type = h('select', { id: ids.type },
        ['person', 'group', 'cohort', 'flag'].map((t) => h('option', { value: t, selected: p.type === t }, t)))
      const pkey = h('input', { id: ids.key, value: p.key === undefined ? '' : String(p.key), autocomplete: 'off', list: 'captured-person-properties' })
      const op = h('select', { id: ids.op },
        OPERATORS.map(([o, label]) => h('option', { value: o, selected: (p.operator || 'exact') === o }, `${label} (${o})`)))
      const value = h('input', { id: ids.value, value: showValue(p.value), autocomplete: 'off',
        placeholder: KIND[p.operator || 'exact'] === 'list' ? 'comma, separated' : '' })
      const update = () => {
        p.type = type.value
        p.key = p.type === 'cohort' ? 'id' : pkey.value
        p.operator = op.value
        p.value = parseValue(op.value, value.value)
        value.disabled = KIND[op.value] === 'none'
        changed()
      }
      value.disabled = KIND[p.operator || 'exact'] === 'none'
      for (const el of [type, pkey, op, value]) el.addEventListener('input', update)
      return h('div', { class: 'row', 'data-property': `${i}.${j}` },
        h('div', {}, h('label', { for: ids.type }, 'Type'), type),
        h('div', {}, h('label', { for: ids.key }, 'Property'), pkey),
        h('div', {}, h('label', { for: ids.op }, 'Operator'), op),
        h('div', {}, h('label', { for: ids.value }, 'Value'), value),
        h('div', {}, h('button', { type: 'button', 'aria-label': `Remove filter ${j + 1} of group ${i + 1}`,
          onclick: () => { g.properties.splice(j, 1); redraw() } }, 'Remove')))
    }

    function variantsView() {
      const variants = (model.multivariate && model.multivariate.variants) || null
      const multi = h('input', { id: 'flag-multi', type: 'checkbox', checked: Boolean(variants) })
      multi.addEventListener('change', () => {
        if (multi.checked) model.multivariate = { variants: [{ key: 'control', rollout_percentage: 50 }, { key: 'test', rollout_percentage: 50 }] }
        else delete model.multivariate
        redraw()
      })
      const box = h('div', {}, h('div', { class: 'inline' }, multi, ' ', h('label', { for: 'flag-multi' }, 'Multiple variants')))
      if (!model.payloads || typeof model.payloads !== 'object') model.payloads = {}
      if (!variants) {
        box.append(payloadField('true', 'Payload when enabled (JSON, optional)'))
        return box
      }
      const sum = h('p', { id: 'variant-sum', 'aria-live': 'polite' })
      const total = () => {
        const s = variants.reduce((a, v) => a + (Number(v.rollout_percentage) || 0), 0)
        sum.className = Math.abs(s - 100) < 1e-9 ? 'notice' : 'error'
        sum.textContent = `Variants sum to ${s}%${Math.abs(s - 100) < 1e-9 ? '' : ' (they must sum to 100%)'}`
      }
      variants.forEach((v, k) => {
        const ids = { key: id('vkey'), pct: id('vpct') }
        const vkey = h('input', { id: ids.key, value: v.key || '', autocomplete: 'off' })
        const pct = h('input', { id: ids.pct, type: 'number', min: 0, max: 100, step: 'any', value: v.rollout_percentage })
        vkey.addEventListener('input', () => {
          if (model.payloads[v.key] !== undefined) { model.payloads[vkey.value] = model.payloads[v.key]; delete model.payloads[v.key] }
          v.key = vkey.value; changed()
        })
        pct.addEventListener('input', () => { v.rollout_percentage = Number(pct.value); total(); changed() })
        box.append(h('fieldset', { 'data-variant': k }, h('legend', {}, `Variant ${k + 1}`),
          h('div', { class: 'row' },
            h('div', {}, h('label', { for: ids.key }, 'Key'), vkey),
            h('div', {}, h('label', { for: ids.pct }, 'Percentage'), pct),
            h('div', {}, h('button', { type: 'button', onclick: () => { variants.splice(k, 1); redraw() } }, `Remove variant ${k + 1}`))),
          payloadField(v.key, `Payload of ${v.key || 'this variant'} (JSON, optional)`)))
      })
      box.append(h('button', { type: 'button', onclick: () => { variants.push({ key: `variant-${variants.length + 1}`, rollout_percentage: 0 }); redraw() } }, 'Add variant'), sum)
      total()
      return box
    }

    function payloadField(variant, label) {
      const pid = id('payload')
      const input = h('textarea', { id: pid, rows: 2, spellcheck: 'false', value: model.payloads[variant] === undefined ? '' : model.payloads[variant] })
      input.addEventListener('input', () => {
        if (input.value.trim() === '') delete model.payloads[variant]
        else model.payloads[variant] = input.value
        changed()
      })
      return h('div', {}, h('label', { for: pid }, label), input)
    }

    const apply = h('button', { type: 'button' }, 'Apply JSON to the form')
    apply.addEventListener('click', () => {
      errors.filters.replaceChildren()
      try {
        const parsed = JSON.parse(json.value)
        if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('filters must be a JSON object')
        for (const k of Object.keys(model)) delete model[k]
        Object.assign(model, parsed)
        if (!Array.isArray(model.groups)) model.groups = []
        redraw()
      } catch (err) {
        errors.filters.replaceChildren(FP.errorBox(`The JSON is not valid: ${err.message}`))
        json.focus()
      }
    })

    const save = h('button', { type: 'submit', class: 'primary' }, isNew ? 'Create flag' : 'Save changes')
    const form = h('form', { novalidate: true, 'aria-labelledby': 'flag-title' },
      h('h1', { id: 'flag-title' }, isNew ? 'New feature flag' : `Edit ${flag.key}`),
      field('key', 'Key', key, h('p', { class: 'muted' }, 'Letters, numbers, hyphens and underscores; what your code asks for.')),
      field('name', 'Name or description', name),
      h('div', { class: 'inline' }, active, ' ', h('label', { for: 'flag-active' }, 'Enabled')),
      h('h2', {}, 'Release conditions'),
      h('p', { class: 'muted' }, 'A user gets the flag when any one group matches: all of its filters, then its rollout percentage.'),
      groupsBox,
      h('h2', {}, 'Variants and payloads'),
      variantsBox,
      h('details', {}, h('summary', {}, 'JSON view of the filters (everything, including what the form has no field for)'),
        h('label', { for: 'flag-json' }, 'Filters as JSON'), json, apply),
      (errors.filters = h('div', { id: 'filters-error', 'aria-live': 'polite' })),
      formError,
      h('div', { class: 'toolbar' }, save, h('a', { href: '#/flags' }, 'Cancel')))
    json.setAttribute('aria-describedby', 'filters-error')

    form.addEventListener('submit', async (ev) => {
      ev.preventDefault()
      for (const box of Object.values(errors)) box.replaceChildren()
      for (const g of groupErrors) { g.box.replaceChildren(); g.rollout.removeAttribute('aria-invalid') }
      formError.replaceChildren()
      key.removeAttribute('aria-invalid')
      const filters = JSON.parse(JSON.stringify(model))
      // The form keeps an empty payloads object to edit; the file need not.
      if (filters.payloads && !Object.keys(filters.payloads).length) delete filters.payloads
      const body = { key: key.value.trim(), name: name.value, active: active.checked, filters }
      if (!isNew) body.version = flag.version
      save.disabled = true
      try {
        const saved = await FP.api(isNew ? 'POST' : 'PATCH', isNew ? 'feature_flags/' : `feature_flags/${flag.id}/`, body)
        FP.flash = `${saved.key} was ${isNew ? 'created' : 'saved'}.`
        FP.go(`#/flag/${saved.id}`)
        return saved
      } catch (err) {
        const attr = err.body && err.body.attr
        const place = attr === 'filters' && /^groups\[(\d+)\]\.(\w+)/.exec(err.message)
        const group = place && groupErrors[Number(place[1])]
        const target = group ? group.box
          : errors[attr] || (attr === 'filters' || (attr && attr.startsWith('filters')) ? errors.filters : formError)
        target.replaceChildren(FP.errorBox(err.message))
        if (attr === 'key') { key.setAttribute('aria-invalid', 'true'); key.focus() }
        else if (group && place[2] === 'rollout_percentage') { group.rollout.setAttribute('aria-invalid', 'true'); group.rollout.focus() }
        else target.scrollIntoView({ block: 'center' })
      } finally {
        save.disabled = false
      }
    })
    redraw()
    main.replaceChildren(form, FP.propertyNames('persons', 'captured-person-properties'))
    if (isNew) key.focus()
  }

  FP.flagForm = render
})()
