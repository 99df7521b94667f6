// Drive PostHog's agent toolkit (@posthog/agent-toolkit, its Vercel AI SDK integration)
// against a flagpost server, as an AI agent would: the AI SDK's generateText with the
// toolkit's tools, where a scripted model (the AI SDK's own MockLanguageModelV2) stands
// in for the LLM and asks for exactly one tool call. The toolkit itself runs unchanged:
// it asks the server who its key is, picks its project, and calls PostHog's REST API.
//
//     node agent_toolkit.mjs HOST PERSONAL_KEY TOOL INPUT_JSON
//
// Prints one JSON object: the toolkit's version, the tools it offered the model, the
// tool's output (parsed when it is JSON) or its error, and every request it made.
// Any request to another host fails the run.

import { readFileSync } from 'node:fs'
import { generateText, stepCountIs } from 'ai'
import { MockLanguageModelV2 } from 'ai/test'
import { PostHogAgentToolkit } from '@posthog/agent-toolkit/integrations/ai-sdk'

const [host, personalKey, toolName, inputJson] = process.argv.slice(2)
const version = JSON.parse(
  readFileSync(
    new URL('./node_modules/@posthog/agent-toolkit/package.json', import.meta.url)
  )
).version

const watchdog = setTimeout(() => {
  console.error('timed out')
  process.exit(2)
}, 60_000)

const requests = []
const realFetch = globalThis.fetch
globalThis.fetch = async (url, options = {}) => {
  const href = String(url)
  if (!href.startsWith(host + '/')) {
    throw new Error(`request to another host: ${href}`)
  }
  const entry = {
    method: options.method ?? 'GET',
    path: new URL(href).pathname,
    body: options.body ? JSON.parse(options.body) : null,
    status: null,
  }
  requests.push(entry)
  const response = await realFetch(url, options)
  entry.status = response.status
  return response
}

const toolkit = new PostHogAgentToolkit({
  posthogPersonalApiKey: personalKey,
  posthogApiBaseUrl: host,
})
const tools = await toolkit.getTools()

const usage = { inputTokens: 1, outputTokens: 1, totalTokens: 2 }
let offered = []
const model = new MockLanguageModelV2({
  doGenerate: async (options) => {
    const called = options.prompt.some((m) => m.role === 'tool')
    if (!called) {
      offered = (options.tools ?? []).map((t) => t.name).sort()
      return {
        content: [
          { type: 'tool-call', toolCallId: 'call-1', toolName, input: inputJson },
        ],
        finishReason: 'tool-calls',
        usage,
        warnings: [],
      }
    }
    return {
      content: [{ type: 'text', text: 'done' }],
      finishReason: 'stop',
      usage,
      warnings: [],
    }
  },
})

const result = await generateText({
  model,
  tools,
  prompt: `use ${toolName}`,
  stopWhen: stepCountIs(2),
})

const parts = result.steps[0]?.content ?? []
const toolResult = parts.find((p) => p.type === 'tool-result')
const toolError = parts.find((p) => p.type === 'tool-error')
const text = toolResult?.output?.content?.[0]?.text
let output = null
if (text !== undefined) {
  try {
    output = JSON.parse(text)
  } catch {
    output = text
  }
}

clearTimeout(watchdog)
console.log(
  JSON.stringify({
    version,
    tools: offered,
    output,
    error: toolError ? String(toolError.error?.message ?? toolError.error) : null,
    requests,
  })
)
