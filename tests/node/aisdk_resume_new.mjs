// useChat({resume: true}) on a chat never posted: on mount the chat calls resumeStream(), which
// asks GET /api/chat/{id}/stream; the chat must end up ready (a 204), not in error, and then send
// its first message as usual. Usage: node aisdk_resume_new.mjs BASE CHAT_ID TEXT
import { AbstractChat, DefaultChatTransport } from '#ai';
import { ChatState, base, headers, id, report, texts } from './common.mjs';

const errors = [];
const chat = new AbstractChat({
  id,
  transport: new DefaultChatTransport({ api: `${base}/api/chat`, headers }),
  state: new ChatState(),
  onError: (error) => errors.push(String(error)),
});
await chat.resumeStream(); // what useChat({resume: true}) does when it mounts
const afterResume = { status: chat.status, count: chat.messages.length, errors: [...errors] };
let afterSend = null;
if (texts[0]) {
  await chat.sendMessage({ text: texts[0] });
  afterSend = { status: chat.status, count: chat.messages.length, errors: [...errors] };
}
report({ afterResume, afterSend });
