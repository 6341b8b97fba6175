// The AI SDK's own client: DefaultChatTransport.sendMessages against POST /api/chat, the reply
// assembled by readUIMessageStream, as useChat does. Usage: node aisdk_chat.mjs BASE CHAT_ID TEXT...
// With AGENT_NAME set, the transport's `body` option names the chat's agent.
import { DefaultChatTransport, readUIMessageStream } from '#ai';
import { base, headers, id, report, texts, userMessage } from './common.mjs';

const body = process.env.AGENT_NAME ? { agent: process.env.AGENT_NAME } : undefined;
const transport = new DefaultChatTransport({ api: `${base}/api/chat`, headers, body });
const messages = [];
const turns = [];
for (const [n, text] of texts.entries()) {
  messages.push(userMessage(text, n + 1));
  const chunks = [];
  const errors = [];
  const stream = await transport.sendMessages({
    chatId: id,
    messages,
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
  });
  const tapped = stream.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        chunks.push(chunk.type);
        controller.enqueue(chunk);
      },
    }),
  );
  let message;
  for await (const update of readUIMessageStream({ stream: tapped, onError: (e) => errors.push(String(e)) })) {
    message = update;
  }
  messages.push(message);
  turns.push({ message, chunks, errors });
}
report({ turns });
