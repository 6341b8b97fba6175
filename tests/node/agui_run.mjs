// AG-UI's own client: HttpAgent.runAgent against POST /ag-ui, one run per text, on one thread.
// Usage: node agui_run.mjs BASE THREAD_ID TEXT...
import { HttpAgent } from '@ag-ui/client';
import { base, headers, id, report, texts } from './common.mjs';

const agent = new HttpAgent({ url: `${base}/ag-ui`, threadId: id, headers });
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
