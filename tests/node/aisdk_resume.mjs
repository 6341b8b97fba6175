// useChat's resume with the AI SDK's own transport: the first stream is cut once the tool call
// starts, reconnectToStream picks the running query up from its first part, the query is stopped
// (POST /sessions/{id}/cancel) from the resumed stream, and a reconnect after that finds nothing
// (null: a 204). Usage: node aisdk_resume.mjs BASE CHAT_ID TEXT
import { DefaultChatTransport, readUIMessageStream } from '#ai';
import { base, headers, id, report, texts, userMessage } from './common.mjs';

const transport = new DefaultChatTransport({ api: `${base}/api/chat`, headers });
const cut = new AbortController();
const first = await transport.sendMessages({
  chatId: id,
  messages: [userMessage(texts[0])],
  trigger: 'submit-message',
  messageId: undefined,
  abortSignal: cut.signal,
});
const firstChunks = [];
const reader = first.getReader();
for (;;) {
  const { value, done } = await reader.read();
  if (done) break;
  firstChunks.push(value.type);
  if (value.type === 'tool-input-start') break;
}
cut.abort(); // the connection drops; the query runs on
await reader.cancel().catch(() => {});

const resumed = await transport.reconnectToStream({ chatId: id });
const resumedChunks = [];
let stop;
const tapped = resumed.pipeThrough(
  new TransformStream({
    transform(chunk, controller) {
      resumedChunks.push(chunk.type);
      if (chunk.type === 'tool-input-available' && stop === undefined) {
        // The tool is running (it never answers): stop the query, as a stop button would.
        stop = fetch(`${base}/sessions/${id}/cancel`, { method: 'POST', headers }).then((r) => r.status);
      }
      controller.enqueue(chunk);
    },
  }),
);
let message;
for await (const update of readUIMessageStream({ stream: tapped })) message = update;
const cancelStatus = await stop;
const again = await transport.reconnectToStream({ chatId: id });
report({ firstChunks, resumedChunks, message, cancelStatus, againIsNull: again === null });
