// The agents a chat may be made for (GET /agents). With more than one, a select by "New chat"
// picks the agent of the next new chat (an empty chat on screen is made again for the agent
// picked), and the session line names the agent of the chat on screen: a chat keeps its agent.
// With one agent (or a server without GET /agents) neither shows and nothing changes.

import { api } from "./api.js";
import { state } from "./state.js";
import { make, ui } from "./view.js";

const known = { names: [], fallback: null };

// Read the agents; false when the server wants a (new) API key (the key form is up).
export async function loadAgents() {
  let reply;
  try {
    reply = await api("GET", "/agents");
  } catch (_) {
    return true; // unreachable: the session calls that follow say so
  }
  if (reply.status === 401) return false;
  const listed = reply.ok && Array.isArray(reply.data.agents) ? reply.data.agents : [];
  const infos = listed.filter((info) => info && typeof info.name === "string");
  known.names = infos.map((info) => info.name);
  known.fallback = typeof reply.data.default === "string" ? reply.data.default : null;
  const picked = ui.agentChoice.value;
  ui.agentChoice.replaceChildren(
    ...infos.map((info) => {
      const option = make("option", null, info.name);
      option.value = info.name;
      if (info.description) option.title = info.description;
      return option;
    }),
  );
  const keep = known.names.includes(picked) ? picked : known.fallback;
  if (keep) ui.agentChoice.value = keep;
  ui.agentChoice.hidden = known.names.length < 2;
  showAgent(state.agent);
  return true;
}

export function agentNames() {
  return [...known.names];
}

// The agent a new chat asks for: the one picked, or none (the server's default) with one agent.
export function chosenAgent() {
  return known.names.length > 1 && ui.agentChoice.value ? ui.agentChoice.value : null;
}

// The chat on screen is the agent's.
export function showAgent(name) {
  state.agent = name || null;
  ui.sessionAgent.textContent = name ? "agent " + name : "";
  ui.sessionAgent.hidden = !name || known.names.length < 2;
}

// Picking an agent while the chat on screen holds nothing yet makes it again for that agent;
// otherwise the pick waits for the next new chat.
export function whenAgentPicked(startOver) {
  ui.agentChoice.addEventListener("change", () => {
    if (ui.transcript.childElementCount === 0 && !state.running && state.agent !== chosenAgent()) startOver();
  });
}
