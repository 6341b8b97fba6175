// What every script here shares: the service's address and key from the command line and
// environment, and one JSON line of results on stdout for the pytest test that ran it.
export const [base, id, ...texts] = process.argv.slice(2);
export const headers = process.env.AGENT_KEY ? { Authorization: `Bearer ${process.env.AGENT_KEY}` } : {};

export function report(result) {
  // Which npm `ai` the script's `#ai` import reached (ai 6, or ai 7 under --conditions=ai7).
  const aiPackage = import.meta.resolve('#ai');
  process.stdout.write(`${JSON.stringify({ ...result, aiPackage })}\n`);
}

export function userMessage(text, n = 1) {
  return { id: `u${n}`, role: 'user', parts: [{ type: 'text', text }] };
}

// The state AbstractChat keeps (what useChat keeps in React state), held plainly.
export class ChatState {
  constructor(messages = []) {
    this.status = 'ready';
    this.error = undefined;
    this.messages = messages;
  }
  pushMessage(message) {
    this.messages = [...this.messages, message];
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}
