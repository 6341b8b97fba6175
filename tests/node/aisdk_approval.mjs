// Tool approval with the AI SDK's own chat (AbstractChat, what useChat wraps): the query stops at a
// tool-approval-request, addToolApprovalResponse answers it, and the chat's next request (what
// sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses sends) continues it.
// Usage: node aisdk_approval.mjs BASE CHAT_ID APPROVED(true|false) TEXT
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from '#ai';
import { ChatState, base, headers, id, report, texts } from './common.mjs';

const [approved, text] = texts;
const chunks = [];
const errors = [];
const transport = new DefaultChatTransport({ api: `${base}/api/chat`, headers });
const chat = new AbstractChat({
  id,
  transport,
  state: new ChatState(),
  onError: (error) => errors.push(String(error)),
});
// Count the chunk types of every response by wrapping the transport's processing.
const send = transport.sendMessages.bind(transport);
transport.sendMessages = async (options) => {
  const stream = await send(options);
  const seen = [];
  chunks.push(seen);
  return stream.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        seen.push(chunk.type);
        controller.enqueue(chunk);
      },
    }),
  );
};

await chat.sendMessage({ text });
const waiting = structuredClone(chat.messages.at(-1));
const part = waiting.parts.find((p) => p.state === 'approval-requested');
await chat.addToolApprovalResponse({ id: part.approval.id, approved: approved === 'true', reason: 'checked by a test' });
const complete = lastAssistantMessageIsCompleteWithApprovalResponses({ messages: chat.messages });
await chat.sendMessage(); // the request sendAutomaticallyWhen would make, awaited here
report({ waiting, complete, final: chat.messages.at(-1), chunks, errors, status: chat.status, count: chat.messages.length });
