// The AI SDK's OpenAI provider on the Responses API: streamText against POST /v1/responses, the
// model id taken from GET /v1/models. Each TEXT after the first goes on from the messages of the
// turns before it, as a chat does (the provider refers to a stored answer by its item's id).
// Usage: node responses_text.mjs BASE - TEXT...
import { streamText } from '#ai';
import { createOpenAI } from '#openai';
import { base, headers, report, texts } from './common.mjs';

const provider = createOpenAI({ baseURL: `${base}/v1`, apiKey: process.env.AGENT_KEY ?? 'unused' });
const { data } = await (await fetch(`${base}/v1/models`, { headers })).json();
const model = provider.responses(data[0].id);
const messages = [];
const turns = [];
for (const text of texts) {
  messages.push({ role: 'user', content: text });
  const errors = [];
  const result = streamText({
    model,
    messages,
    include: { requestBody: true }, // ai 7 keeps the request body only when asked
    onError: ({ error }) => errors.push(String(error)),
  });
  const parts = [];
  let streamed = '';
  for await (const part of result.fullStream) {
    parts.push(part.type);
    if (part.type === 'text-delta') streamed += part.text;
  }
  // No step when the request was refused: the error is reported instead.
  const [step] = await result.steps;
  const body = step?.request.body;
  turns.push({
    parts,
    streamed,
    text: await result.text,
    finishReason: await result.finishReason,
    usage: await result.usage,
    responseId: (await result.providerMetadata)?.openai?.responseId,
    input: body === undefined ? null : (typeof body === 'string' ? JSON.parse(body) : body).input,
    errors,
  });
  messages.push(...(await result.response).messages);
}
report({ turns, openaiPackage: import.meta.resolve('#openai') });
