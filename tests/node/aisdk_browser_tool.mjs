// A tool the browser runs itself, with the AI SDK's own chat (AbstractChat, what useChat wraps): the
// transport's body declares it, onToolCall answers its call with addToolOutput, and
// sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls sends the result, which
// continues the query. Meanwhile a second tab's chat resumes the running query (resumeStream) and
// a script follows the session's events; once all is over that tab loads the chat (GET /api/chat/{id}).
// Usage: node aisdk_browser_tool.mjs BASE CHAT_ID TEXT
import { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithToolCalls } from '#ai';
import { ChatState, base, headers, id, report, texts } from './common.mjs';

const tools = {
  get_location: {
    description: 'Where the user is',
    inputSchema: { type: 'object', properties: {} },
  },
};
const errors = [];
const chunks = []; // the chunk types of each response the first tab got
const calls = [];

function tappedTransport(seen) {
  const transport = new DefaultChatTransport({ api: `${base}/api/chat`, headers, body: { tools } });
  for (const method of ['sendMessages', 'reconnectToStream']) {
    const original = transport[method].bind(transport);
    transport[method] = async (options) => {
      const stream = await original(options);
      if (stream == null) return stream;
      const types = [];
      seen.push(types);
      return stream.pipeThrough(
        new TransformStream({
          transform(chunk, controller) {
            types.push(chunk.type);
            controller.enqueue(chunk);
          },
        }),
      );
    };
  }
  return transport;
}

// The session's events (GET /sessions/{id}/events from the first), until the query's done.
async function followSession() {
  const response = await fetch(`${base}/sessions/${id}/events?last_event_id=0`, { headers });
  const events = [];
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const bytes of response.body) {
    buffer += decoder.decode(bytes, { stream: true }).replaceAll('\r\n', '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) !== -1) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const fields = Object.fromEntries(
        block.split('\n').filter((line) => line && !line.startsWith(':')).map((line) => {
          const colon = line.indexOf(':');
          return [line.slice(0, colon), line.slice(colon + 1).trimStart()];
        }),
      );
      if (fields.data === undefined) continue;
      events.push({ id: Number(fields.id), type: fields.event, data: JSON.parse(fields.data) });
      if (fields.event === 'done') return events;
    }
  }
  return events;
}

const watcherChunks = [];
const watcher = new AbstractChat({
  id,
  transport: tappedTransport(watcherChunks),
  state: new ChatState(),
  onError: (error) => errors.push(`watcher: ${error}`),
});
let watching;
let following;

const chat = new AbstractChat({
  id,
  transport: tappedTransport(chunks),
  state: new ChatState(),
  onError: (error) => errors.push(String(error)),
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls,
  async onToolCall({ toolCall }) {
    if (toolCall.dynamic) return; // the service's own tools, run on the server
    calls.push(structuredClone(toolCall));
    following = followSession();
    // The other tab resumes the query while it waits; its stream ends with the step awaiting the
    // result, as this one's does. Then the result, not awaited here (the chat's job runs this).
    await watcher.resumeStream();
    watching = structuredClone(watcher.messages);
    chat.addToolOutput({ tool: toolCall.toolName, toolCallId: toolCall.toolCallId, output: { city: 'Lyon' } });
  },
});

await chat.sendMessage({ text: texts[0] });
const events = await following;
const loaded = await (await fetch(`${base}/api/chat/${id}`, { headers })).json();
report({ calls, chunks, messages: chat.messages, status: chat.status, watching, watcherChunks, events, loaded, errors });
