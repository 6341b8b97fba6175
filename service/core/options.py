"""What a query may ask beyond its text: :class:`RunOptions`.

Most clients send a message and let the agent work with its own tools. A client that speaks a
model's protocol (the OpenAI Chat Completions face) brings more: tools it runs itself, its own
system prompt, a token limit, and sometimes no new text at all, only the results of the tools the
model asked it to run. The run manager carries these from the transport to the agent untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RunOptions:
    """One query's extras; the defaults ask for nothing beyond the message.

    - ``client_tools``: specs (``name``, ``description``, ``input_schema``) of tools the client
      runs itself. They are offered to the model beside the agent's own (a client tool hides an
      own tool of the same name); a turn that calls one ends the query with ``stop_reason:
      tool_use``, its calls to client tools left unanswered in the conversation for the client.
    - ``system``: the client's system prompt, after the service's own.
    - ``max_tokens``: the most output tokens a model turn may take, below the service's limit.
    - ``resume``: the conversation already ends with the user's turn (the results of client
      tools); the query adds no text of its own and the model answers that turn.
    - ``approvals``: False when nobody can answer a tool approval for this query (the client's
      protocol has no way to): a call that needs one is declined at once, its error result
      telling the model why, rather than waiting until ``AGENT_APPROVAL_TIMEOUT_S``.
    - ``client_tools_wait``: a call of a client tool waits for its result as an approval waits
      (status ``waiting``, answered once from any tab, an error result after
      ``AGENT_CLIENT_TOOL_TIMEOUT_S``) and the same query goes on, rather than ending the query
      for the client's next one to carry the result (as OpenAI's Chat Completions do).
    - ``message_id``: the id of the user's message (the client's own); one is made without it.
    - ``reply_id``: the id of the answer; one is made without it.
    - ``rewind_to``: cut the conversation back to before the message of that id first (see
      :mod:`service.core.conversation`): with ``resume``, a regenerate of the answer it names;
      without, an edit of the user's message it names.
    - ``rewind_if_held``: a ``rewind_to`` the conversation no longer holds is skipped rather than
      refused (a rollback's: the message it would cut may be gone already).
    - ``prelude``: messages the query adds to the conversation before its own text, in Bedrock's
      format: the history a stateless client sends with each request (OpenAI's Responses
      ``input`` items), or, with ``resume``, the results of the client's tools. They go in when
      the query starts, on the conversation as it stands then (on a shared store, as the claim
      read it), so nothing a face did to its copy of the session is lost.
    - ``request``: what the face that started the query keeps of its client's request (JSON), told
      again on ``run_started`` so that any instance can show it (the Responses face's
      ``instructions``, ``tools`` and ``metadata``).
    """

    client_tools: tuple[dict[str, Any], ...] = ()
    system: str = ""
    max_tokens: int | None = None
    resume: bool = False
    approvals: bool = True
    client_tools_wait: bool = False
    message_id: str = ""
    reply_id: str = ""
    rewind_to: str = ""
    rewind_if_held: bool = False
    prelude: tuple[dict[str, Any], ...] = ()
    request: dict[str, Any] | None = None

    @property
    def client_tool_names(self) -> frozenset[str]:
        """The names of the client's tools."""
        return frozenset(spec["name"] for spec in self.client_tools)
