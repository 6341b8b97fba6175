// Two tabs on one chat with the AI SDK's own chat (AbstractChat, what useChat wraps): the first
// asks a long question; once its answer streams, the second sends its own message with the
// transport's body { multitask_strategy } (enqueue: it waits its turn; interrupt: the first stops).
// Usage: node aisdk_multitask.mjs BASE CHAT_ID STRATEGY FIRST_TEXT SECOND_TEXT
import { AbstractChat, DefaultChatTransport } from '#ai';
import { ChatState, base, headers, id, report, texts } from './common.mjs';

const [strategy, firstText, secondText] = texts;
const errors = [];

function tab(name, body, onChunk) {
  const transport = new DefaultChatTransport({ api: `${base}/api/chat`, headers, body });
  const chunks = [];
  const send = transport.sendMessages.bind(transport);
  transport.sendMessages = async (options) => {
    const stream = await send(options);
    return stream.pipeThrough(
      new TransformStream({
        transform(chunk, controller) {
          chunks.push(chunk.type);
          onChunk?.(chunk);
          controller.enqueue(chunk);
        },
      }),
    );
  };
  const chat = new AbstractChat({
    id,
    transport,
    state: new ChatState(),
    onError: (error) => errors.push(`${name}: ${error}`),
  });
  return { chat, chunks };
}

const second = tab('second', { multitask_strategy: strategy });
let sent;
const first = tab('first', {}, (chunk) => {
  if (chunk.type === 'text-delta' && sent === undefined) {
    sent = second.chat.sendMessage({ text: secondText });
  }
});
await first.chat.sendMessage({ text: firstText });
await sent;
report({
  errors,
  first: { messages: first.chat.messages, chunks: first.chunks, status: first.chat.status },
  second: { messages: second.chat.messages, chunks: second.chunks, status: second.chat.status },
});
