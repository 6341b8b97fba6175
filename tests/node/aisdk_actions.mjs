// A chat's actions with the AI SDK's own chat (AbstractChat, what useChat wraps), one after another:
// send a message, regenerate an answer, edit a question (sendMessage with its messageId), and load
// the chat from GET /api/chat/{id} into a new chat, as useChat({messages}) would be given it.
// Usage: node aisdk_actions.mjs BASE CHAT_ID ACTIONS_JSON, where each action is one of
//   {"send": TEXT}  {"regenerate": MESSAGE_INDEX|null}  {"edit": MESSAGE_INDEX, "text": TEXT}  {"load": true}
import { AbstractChat, DefaultChatTransport } from '#ai';
import { ChatState, base, headers, id, report, texts } from './common.mjs';

const actions = JSON.parse(texts[0]);
const errors = [];
const newChat = (messages = []) =>
  new AbstractChat({
    id,
    transport: new DefaultChatTransport({ api: `${base}/api/chat`, headers }),
    state: new ChatState(messages),
    onError: (error) => errors.push(String(error)),
  });

let chat = newChat();
const steps = [];
for (const action of actions) {
  let loaded;
  if ('send' in action) {
    await chat.sendMessage({ text: action.send });
  } else if ('regenerate' in action) {
    const messageId = action.regenerate == null ? undefined : chat.messages[action.regenerate].id;
    await chat.regenerate({ messageId });
  } else if ('edit' in action) {
    await chat.sendMessage({ text: action.text, messageId: chat.messages[action.edit].id });
  } else if ('load' in action) {
    const response = await fetch(`${base}/api/chat/${id}`, { headers });
    loaded = await response.json();
    chat = newChat(loaded);
  }
  steps.push({ action, status: chat.status, messages: structuredClone(chat.messages), loaded });
}
report({ steps, errors });
