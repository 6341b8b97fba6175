"""Built-in AWS tools: ``list_s3_buckets`` lists the S3 buckets of the configured account.

boto3's standard credential chain and region apply (environment, ``~/.aws``, instance roles), and
no ``endpoint_url`` is passed, so boto3's own ``AWS_ENDPOINT_URL_S3`` (or ``AWS_ENDPOINT_URL``)
can point the tool at another S3, such as moto or MinIO. boto3 blocks, so the call runs in a
worker thread (a sync :class:`~service.agent.tools.FunctionTool`). The tool is always offered;
missing credentials, an unreachable endpoint or a refusal become an error tool result with a
message the model can pass on, e.g. "AWS credentials are not configured".
"""

from __future__ import annotations

from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from service.agent.tools import FunctionTool, Tool

__all__ = ["AwsToolError", "aws_tools", "list_s3_buckets", "list_s3_buckets_tool"]

# Short limits: the model waits for the answer, and the executor's own timeout cuts in anyway.
_CLIENT_CONFIG = Config(
    connect_timeout=5,
    read_timeout=15,
    retries={"mode": "standard", "max_attempts": 2},
)

NO_CREDENTIALS = "AWS credentials are not configured"


class AwsToolError(RuntimeError):
    """An AWS tool could not do its job; the message says why, in words for the model."""


def list_s3_buckets(_: dict[str, Any]) -> str:
    """List the account's S3 bucket names, sorted, one per line (blocking: run it in a thread)."""
    # A session per call: credentials and endpoints come from the environment, which may change,
    # and boto3 sessions are not safe to share between threads.
    client = None
    endpoint = "the configured endpoint"
    try:
        # Inside the try: a missing profile or a broken credential process fail right here.
        session = boto3.session.Session()
        if session.get_credentials() is None:
            raise AwsToolError(NO_CREDENTIALS)
        client = session.client("s3", config=_CLIENT_CONFIG)
        endpoint = client.meta.endpoint_url
        names: list[str] = []
        if client.can_paginate("list_buckets"):
            for page in client.get_paginator("list_buckets").paginate():
                names.extend(bucket["Name"] for bucket in page.get("Buckets", []))
        else:
            names = [bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])]
    except NoCredentialsError:
        raise AwsToolError(NO_CREDENTIALS) from None
    except PartialCredentialsError as exc:
        raise AwsToolError(f"AWS credentials are incomplete: {exc}") from None
    except (botocore.exceptions.ConnectionError, HTTPClientError) as exc:
        raise AwsToolError(f"S3 is unreachable at {endpoint}: {exc}") from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = error.get("Code", "Error")
        message = error.get("Message") or str(exc)
        raise AwsToolError(f"S3 refused to list buckets: {code}: {message}") from None
    except BotoCoreError as exc:
        raise AwsToolError(f"AWS request failed: {exc}") from None
    finally:
        if client is not None:
            client.close()
    if not names:
        return "No S3 buckets."
    # S3 lists by name, but S3-compatible stores need not; a stable order reads better.
    names.sort()
    noun = "bucket" if len(names) == 1 else "buckets"
    return f"{len(names)} S3 {noun}:\n" + "\n".join(names)


def list_s3_buckets_tool() -> Tool:
    """The ``list_s3_buckets`` tool."""
    return FunctionTool(
        "list_s3_buckets",
        "List the names of the S3 buckets in the configured AWS account. Takes no input.",
        {"type": "object", "properties": {}},
        list_s3_buckets,
    )


def aws_tools() -> list[Tool]:
    """Every built-in AWS tool."""
    return [list_s3_buckets_tool()]
