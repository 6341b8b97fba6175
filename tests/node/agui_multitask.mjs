// A second HttpAgent sends to a thread whose query still runs, with
// `forwardedProps.multitask_strategy`; the first run starts streaming before the second is sent.
// Usage: node agui_multitask.mjs BASE THREAD_ID STRATEGY FIRST_TEXT SECOND_TEXT
import { HttpAgent } from '@ag-ui/client';
import { base, headers, id, report, texts } from './common.mjs';

const [strategy, firstText, secondText] = texts;

function start(text, runId, input, onStreaming) {
  const agent = new HttpAgent({ url: `${base}/ag-ui`, threadId: id, headers });
  agent.addMessage({ id: `${runId}-user`, role: 'user', content: text });
  const events = [];
  const done = agent
    .runAgent(
      { runId, ...input },
      {
        onEvent({ event }) {
          events.push(event);
          if (event.type === 'TEXT_MESSAGE_CONTENT') onStreaming?.();
        },
      },
    )
    .then(
      ({ result }) => ({ events, result, messages: structuredClone(agent.messages) }),
      (error) => ({ events, error: String(error), status: error.status ?? null }),
    );
  return done;
}

let streaming;
const isStreaming = new Promise((resolve) => {
  streaming = resolve;
});
const first = start(firstText, 'run-1', {}, streaming);
await isStreaming;
const second = start(secondText, 'run-2', { forwardedProps: { multitask_strategy: strategy } });
report({ first: await first, second: await second });
