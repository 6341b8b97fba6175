// Tool approval with AG-UI's own client (HttpAgent): the first run ends with RUN_FINISHED whose
// outcome is an interrupt; the next run's resume answers it and continues the same query.
// Usage: node agui_approval.mjs BASE THREAD_ID APPROVED(true|false) TEXT
import { HttpAgent } from '@ag-ui/client';
import { base, headers, id, report, texts } from './common.mjs';

const [approved, text] = texts;
const agent = new HttpAgent({ url: `${base}/ag-ui`, threadId: id, headers });
agent.addMessage({ id: 'u1', role: 'user', content: text });
const runs = [];
async function run(input) {
  const events = [];
  const { result } = await agent.runAgent(input, {
    onEvent({ event }) {
      events.push(event);
    },
  });
  runs.push({ events, result, pending: structuredClone(agent.pendingInterrupts) });
}
await run({ runId: 'run-1' });
const resume = agent.pendingInterrupts.map((interrupt) => ({
  interruptId: interrupt.id,
  status: 'resolved',
  payload: { approved: approved === 'true', reason: 'checked by a test' },
}));
await run({ runId: 'run-2', resume });
report({ runs, messages: structuredClone(agent.messages) });
