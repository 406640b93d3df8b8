"""Raw signed requests, for the cases boto3 will not send."""

from __future__ import annotations

import http.client
import json
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.server.conftest import KEY_ID, SECRET


def raw_call(
    server: Any,
    body: bytes,
    *,
    target: str,
    content_type: str = "application/x-amz-json-1.1",
) -> tuple[int, dict[str, Any]]:
    """POST ``body``, signed correctly, with the given target and content type."""
    req = AWSRequest(
        method="POST",
        url=server.url + "/",
        data=body,
        headers={"Content-Type": content_type, "X-Amz-Target": target},
    )
    SigV4Auth(Credentials(KEY_ID, SECRET), "sagemaker", "us-east-1").add_auth(req)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/", body=body, headers=dict(req.headers.items()))
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()
