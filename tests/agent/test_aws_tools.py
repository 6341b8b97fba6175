"""The built-in ``list_s3_buckets`` tool against moto's S3 in server mode (real HTTP on loopback),
reached through boto3's own ``AWS_ENDPOINT_URL_S3``."""

from __future__ import annotations

import inspect
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from service.agent.aws_tools import NO_CREDENTIALS, aws_tools, list_s3_buckets_tool
from service.agent.tools import FunctionTool, ToolExecutor
from tests.conftest import ClientFactory, stream_agent
from tests.support._pipes import free_port

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """moto's server on a free loopback port."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An environment with no AWS settings at all: no keys, no files, no instance metadata."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _dummy_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture
def moto_s3(no_aws: None, moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """boto3 pointed at moto by the environment alone; an emptied S3 client to fill."""
    _dummy_credentials(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_url)
    # moto's state lives in this process and outlives a test; start each one empty.
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")).close()
    return boto3.client("s3")  # no endpoint_url: the environment variable decides


async def test_it_lists_the_buckets(moto_s3: Any) -> None:
    for name in ("beta-bucket", "alpha-bucket"):
        moto_s3.create_bucket(Bucket=name)
    outcome = await ToolExecutor(aws_tools()).run("list_s3_buckets", "t1", {})
    assert not outcome.is_error, outcome.result
    assert outcome.result == "2 S3 buckets:\nalpha-bucket\nbeta-bucket"


async def test_no_buckets(moto_s3: Any) -> None:
    outcome = await ToolExecutor(aws_tools()).run("list_s3_buckets", "t1", {})
    assert (outcome.result, outcome.is_error) == ("No S3 buckets.", False)


async def test_without_credentials_the_error_says_so(no_aws: None) -> None:
    outcome = await ToolExecutor(aws_tools()).run("list_s3_buckets", "t1", {})
    assert outcome.is_error
    assert NO_CREDENTIALS in outcome.result


async def test_an_unreachable_endpoint_is_a_clear_error(
    no_aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _dummy_credentials(monkeypatch)
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    outcome = await ToolExecutor(aws_tools(), timeout=30).run("list_s3_buckets", "t1", {})
    assert outcome.is_error
    assert f"S3 is unreachable at {endpoint}" in outcome.result


def test_the_blocking_call_runs_in_a_worker_thread() -> None:
    tool = list_s3_buckets_tool()
    # A sync FunctionTool is run with asyncio.to_thread, so boto3 never blocks the event loop.
    assert isinstance(tool, FunctionTool) and not inspect.iscoroutinefunction(tool.func)
    assert tool.name == "list_s3_buckets" and tool.input_schema["type"] == "object"


async def test_the_model_lists_buckets_over_http(make_client: ClientFactory, moto_s3: Any) -> None:
    moto_s3.create_bucket(Bucket="reports")
    moto_s3.create_bucket(Bucket="uploads")
    client = await make_client(tool_timeout_s=20)
    events = await stream_agent(client, "Which buckets do I have? [emu:tool=list_s3_buckets]")
    (result,) = [event for event in events if event["type"] == "tool_result"]
    assert result["tool"] == "list_s3_buckets" and not result.get("is_error")
    assert result["result"] == "2 S3 buckets:\nreports\nuploads"
    assert events[-1]["type"] == "done"


async def test_the_model_is_told_when_credentials_are_missing(
    make_client: ClientFactory, no_aws: None
) -> None:
    client = await make_client(tool_timeout_s=20)
    events = await stream_agent(client, "[emu:tool=list_s3_buckets]")
    (result,) = [event for event in events if event["type"] == "tool_result"]
    assert result["is_error"] is True and NO_CREDENTIALS in result["result"]
