// A frontend tool with AG-UI's own client (HttpAgent): the first run ends with the model's call of
// the client's tool pending; the client answers it with a `tool` message, and the next run goes
// on with the same query; a third run asks a new question on the same thread.
// Usage: node agui_tools.mjs BASE THREAD_ID TEXT ANSWER
import { HttpAgent } from '@ag-ui/client';
import { base, headers, id, report, texts } from './common.mjs';

const [text, answer] = texts;
const tools = [
  {
    name: 'get_location',
    description: 'Where the user is',
    parameters: { type: 'object', properties: {} },
  },
];
const agent = new HttpAgent({ url: `${base}/ag-ui`, threadId: id, headers });
agent.addMessage({ id: 'u1', role: 'user', content: text });
const runs = [];
async function run(runId) {
  const events = [];
  let pending = null;
  const { result } = await agent.runAgent(
    { runId, tools },
    {
      onEvent({ event }) {
        events.push(event);
      },
      onRunFinishedEvent(params) {
        if (params.outcome === 'success') pending = params.pendingToolCallIds;
      },
    },
  );
  runs.push({ events, result, pending, messages: structuredClone(agent.messages) });
  return pending ?? [];
}
const pending = await run('run-1');
for (const [n, toolCallId] of pending.entries()) {
  agent.addMessage({ id: `answer-${n + 1}`, role: 'tool', toolCallId, content: answer });
}
await run('run-2');
agent.addMessage({ id: 'u2', role: 'user', content: 'Thanks [emu:tokens=3]' });
await run('run-3');
report({ runs });
