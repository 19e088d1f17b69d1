"""A real S3 API on localhost for the store tests: moto's server mode, one per test session.

Nothing leaves the machine: the server binds 127.0.0.1 on a free port, and s3fs is given its
endpoint and fixed credentials (no lookups of AWS configuration or instance metadata).
"""

from __future__ import annotations

import uuid

import pytest

from ucp.integrations.launch import free_port


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture()
def s3(s3_endpoint, monkeypatch):
    """``(bucket URL, storage_options)`` of a fresh bucket on the local S3 server."""
    import boto3

    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    bucket = f"ucp-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    options = {"key": "testing", "secret": "testing", "endpoint_url": s3_endpoint,
               "client_kwargs": {"region_name": "us-east-1"}}
    return f"s3://{bucket}", options
