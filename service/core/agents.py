"""The agents a service runs, as the faces see them: names and what to show of each.

The agents themselves (a model, a system prompt, tools, an approval policy) are built by
:mod:`service.agent.catalog` from ``AGENT_AGENTS_FILE`` or, without one, from the environment as
the one agent ``default``. A session is bound to one of them when it is made
(:attr:`~service.core.sessions.Session.agent`); the faces check the name a client gives through
an :class:`AgentDirectory`, never the catalog, so they stay free of providers and tools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from service.core.sessions import DEFAULT_AGENT
from service.errors import AgentMismatch, ClientToolsRefused, UnknownAgent


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What a client may see of an agent."""

    name: str
    description: str
    provider: str
    model: str
    tools: tuple[str, ...]
    client_tools: bool = True


class AgentDirectory(Protocol):
    """The agents by name, as they are defined now (a reload may change them)."""

    @property
    def default(self) -> str:
        """The agent of a session made without naming one."""
        ...

    def agents(self) -> list[AgentInfo]:
        """Every agent, in the order they are defined."""
        ...


class OneAgent:
    """A directory of one agent (``default``): a service built without a catalog."""

    def __init__(self, info: AgentInfo | None = None) -> None:
        self.info = info or AgentInfo(DEFAULT_AGENT, "", "", "", ())

    @property
    def default(self) -> str:
        return self.info.name

    def agents(self) -> list[AgentInfo]:
        return [self.info]


def chosen(directory: AgentDirectory, name: str | None) -> str:
    """The agent a new session is made for: ``name``, or the default one (also for ``default``,
    whatever the default agent is called); :class:`UnknownAgent` naming the known ones for a
    name that is not defined."""
    if name is None or name == "" or name == DEFAULT_AGENT:
        return directory.default
    known = [info.name for info in directory.agents()]
    if name not in known:
        raise UnknownAgent(name, known)
    return name


def info_of(directory: AgentDirectory, name: str) -> AgentInfo | None:
    """The agent of that name (``default`` is always the default one), None if none is defined."""
    wanted = directory.default if name == DEFAULT_AGENT else name
    for info in directory.agents():
        if info.name == wanted:
            return info
    return None


def same_agent(directory: AgentDirectory, bound: str, name: str) -> bool:
    """True when a session bound to ``bound`` is one of the agent ``name`` (``default``, which
    sessions made before agents had names carry, is the default agent's name too)."""
    return bound == name or {bound, name} == {DEFAULT_AGENT, directory.default}


def check_bound(directory: AgentDirectory, bound: str, name: str | None) -> None:
    """:class:`AgentMismatch` when a request names an agent (``name``) other than the one its
    session is bound to; naming none is always fine (the session's own answers)."""
    if name is not None and name != "" and not same_agent(directory, bound, chosen(directory, name)):
        raise AgentMismatch(name, bound)


def check_client_tools(directory: AgentDirectory, agent: str, count: int) -> None:
    """:class:`ClientToolsRefused` when ``count`` client tools are sent to an agent defined with
    ``client_tools = false`` (an agent a reload removed refuses none: its query fails anyway)."""
    info = info_of(directory, agent)
    if count and info is not None and not info.client_tools:
        raise ClientToolsRefused(
            f"the agent {info.name!r} takes no client tools (client_tools = false); send the message without tools"
        )
