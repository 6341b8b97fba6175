"""A scripted, deterministic model that speaks Bedrock's ConverseStream over real HTTP.

It is the service's default provider (no AWS account needed) and the upstream of every
integration test and benchmark. boto3 reads it as it reads Bedrock: point the client's
``endpoint_url`` (or ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME``) at it. The same answers are served
OpenAI-style at ``POST /v1/chat/completions`` (see :mod:`service.emulator.openai`), so an
OpenAI-compatible client takes ``<url>/v1`` as its base URL. Behaviour is steered by
``[emu:...]`` directives in the prompt; see :mod:`service.emulator.script`.
"""

from service.emulator.embedded import EmbeddedEmulator
from service.emulator.records import RequestRecord
from service.emulator.server import EmulatorConfig, create_emulator_app

__all__ = ["EmbeddedEmulator", "EmulatorConfig", "RequestRecord", "create_emulator_app"]
