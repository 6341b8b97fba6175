// A function tool the AI SDK defines and runs itself (`execute`), offered to the service through
// the OpenAI provider's Responses model: streamText goes on for up to three steps, the second
// sending the tool's output back. The tool's answer carries FORECAST, which only it knows.
// Usage: node responses_tools.mjs BASE - TEXT FORECAST
import { jsonSchema, stepCountIs, streamText, tool } from '#ai';
import { createOpenAI } from '#openai';
import { base, headers, report, texts } from './common.mjs';

const [prompt, forecast] = texts;
const provider = createOpenAI({ baseURL: `${base}/v1`, apiKey: process.env.AGENT_KEY ?? 'unused' });
const { data } = await (await fetch(`${base}/v1/models`, { headers })).json();
const ran = [];
const getWeather = tool({
  description: 'The weather in a city.',
  inputSchema: jsonSchema({
    type: 'object',
    properties: { city: { type: 'string' } },
    required: ['city'],
    additionalProperties: false,
  }),
  execute: async ({ city }) => {
    ran.push(city);
    return `${forecast} in ${city}`;
  },
});
const errors = [];
const result = streamText({
  model: provider.responses(data[0].id),
  prompt,
  tools: { get_weather: getWeather },
  stopWhen: stepCountIs(3),
  include: { requestBody: true }, // ai 7 keeps each step's request body only when asked
  onError: ({ error }) => errors.push(String(error)),
});
const parts = [];
for await (const part of result.fullStream) parts.push(part.type);
const steps = (await result.steps).map((step) => {
  const body = step.request.body;
  return {
    input: (typeof body === 'string' ? JSON.parse(body) : body).input,
    toolCalls: step.toolCalls.map(({ toolCallId, toolName, input }) => ({ toolCallId, toolName, input })),
    toolResults: step.toolResults.map(({ toolCallId, output }) => ({ toolCallId, output })),
    text: step.text,
    finishReason: step.finishReason,
    responseId: step.providerMetadata?.openai?.responseId,
  };
});
report({ parts, steps, ran, text: await result.text, errors, openaiPackage: import.meta.resolve('#openai') });
