// AG-UI's own client: HttpAgent.runAgent against POST /ag-ui, one run per text, on one thread.
// Usage: node agui_run.mjs BASE THREAD_ID TEXT... (AGENT_NAME set: the agent's own URL, /ag-ui/NAME)
import { HttpAgent } from '@ag-ui/client';
import { base, headers, id, report, texts } from './common.mjs';

const url = process.env.AGENT_NAME ? `${base}/ag-ui/${process.env.AGENT_NAME}` : `${base}/ag-ui`;
const agent = new HttpAgent({ url, threadId: id, headers });
const runs = [];
for (const [n, text] of texts.entries()) {
  agent.addMessage({ id: `u${n + 1}`, role: 'user', content: text });
  const events = [];
  const { result, newMessages } = await agent.runAgent(
    { runId: `run-${n + 1}` },
    {
      onEvent({ event }) {
        events.push(event);
      },
    },
  );
  runs.push({ events, result, newMessages, messages: structuredClone(agent.messages) });
}
report({ runs });
