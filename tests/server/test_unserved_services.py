"""Clients of services trainport does not serve (IAM and STS, which the SageMaker SDK asks,
and one service of each other AWS protocol) get an error their own parser reads: a
ClientError that says the service is not served, through real boto3 clients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import client

CALLS: dict[str, tuple[str, Callable[[Any], object]]] = {
    "iam (query)": ("iam", lambda c: c.get_role(RoleName="trainer")),
    "sts (query)": ("sts", lambda c: c.get_caller_identity()),
    "ec2 (ec2)": ("ec2", lambda c: c.describe_instances()),
    "s3 (rest-xml)": ("s3", lambda c: c.list_buckets()),
    "ecr (json)": ("ecr", lambda c: c.describe_repositories()),
    "lambda (rest-json)": ("lambda", lambda c: c.list_functions()),
    "cloudwatch (rpc-v2-cbor)": ("cloudwatch", lambda c: c.list_metrics()),
}


@pytest.mark.parametrize("case", list(CALLS))
def test_a_service_not_served_is_a_client_error_that_says_so(server: Any, case: str) -> None:
    service, call = CALLS[case]
    with pytest.raises(ClientError) as caught:
        call(client(server, service))
    error = caught.value.response["Error"]
    assert error["Code"] == "ServiceNotServed", caught.value.response
    assert "not the" in error["Message"] and "service" in error["Message"]
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    client(server).list_training_jobs()


def test_iam_says_what_to_do_instead(server: Any) -> None:
    with pytest.raises(ClientError) as caught:
        client(server, "iam").get_role(RoleName="trainer")
    message = caught.value.response["Error"]["Message"]
    assert "'iam'" in message and "arn:aws:iam::" in message


@pytest.mark.parametrize("service", ["iam", "sts", "ecr"])
def test_a_wrong_secret_for_another_service_is_refused_in_its_protocol(
    server: Any, service: str
) -> None:
    calls = {
        "iam": lambda c: c.list_roles(),
        "sts": lambda c: c.get_caller_identity(),
        "ecr": lambda c: c.describe_repositories(),
    }
    with pytest.raises(ClientError) as caught:
        calls[service](client(server, service, secret="not-the-secret"))
    assert caught.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
