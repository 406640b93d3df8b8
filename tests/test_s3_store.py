"""Jobs against an S3-compatible endpoint: moto's server mode over real HTTP."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import boto3
import pytest

from tests.conftest import free_port, python_job, wait_for
from trainport.config import load_settings
from trainport.errors import StoreError, ValidationError
from trainport.jobs.service import JobService
from trainport.store.s3 import S3Store


def s3(endpoint: str):  # type: ignore[no-untyped-def]
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def channel(uri: str, name: str = "train") -> dict[str, object]:
    return {
        "ChannelName": name,
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri}},
    }


LIST_CHANNEL = (
    "import os; base=os.environ['SAGEMAKER_BASE_DIR']; d=base+'/input/data/train'\n"
    "for root, _, names in sorted(os.walk(d)):\n"
    "    for n in sorted(names): print(os.path.relpath(os.path.join(root, n), d), open(os.path.join(root, n)).read())\n"
    "open(base+'/model/m.txt','w').write('model')\n"
)


def test_job_stages_from_and_uploads_to_s3(s3_home: Path, moto_endpoint: str) -> None:
    client = s3(moto_endpoint)
    client.create_bucket(Bucket="s3-data")
    client.put_object(Bucket="s3-data", Key="ds/a.txt", Body=b"A")
    client.put_object(Bucket="s3-data", Key="ds/sub/b.txt", Body=b"B")
    client.put_object(Bucket="s3-data", Key="ds/folder/", Body=b"")  # a "directory" marker
    service = JobService(load_settings())
    service.create(
        python_job(
            "s3-job",
            LIST_CHANNEL,
            InputDataConfig=[channel("s3://s3-data/ds/")],
            OutputDataConfig={"S3OutputPath": "s3://s3-out/prefix"},
        ),
        runner="process",
    )
    record = wait_for(service, "s3-job")
    assert record.status == "Completed", record.failure_reason
    assert [line for _, line in service.logs("s3-job")] == ["a.txt A", "sub/b.txt B"]
    assert record.model_artifacts == "s3://s3-out/prefix/s3-job/output/model.tar.gz"
    body = client.get_object(Bucket="s3-out", Key="prefix/s3-job/output/model.tar.gz")[
        "Body"
    ].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert tar.getnames() == ["m.txt"]
    assert client.head_object(Bucket="s3-out", Key="prefix/s3-job/output/output.tar.gz")


def test_an_object_uri_stages_each_match_under_its_own_name(
    s3_home: Path, moto_endpoint: str
) -> None:
    client = s3(moto_endpoint)
    client.create_bucket(Bucket="s3-one")
    client.put_object(Bucket="s3-one", Key="p/a.txt", Body=b"A")
    client.put_object(Bucket="s3-one", Key="p/a.txt.bak", Body=b"B")
    service = JobService(load_settings())
    service.create(
        python_job("s3-one", LIST_CHANNEL, InputDataConfig=[channel("s3://s3-one/p/a.txt")]),
        runner="process",
    )
    record = wait_for(service, "s3-one")
    assert record.status == "Completed", record.failure_reason
    assert [line for _, line in service.logs("s3-one")] == ["a.txt A", "a.txt.bak B"]


def test_key_escaping_the_channel_is_refused(s3_home: Path, moto_endpoint: str) -> None:
    client = s3(moto_endpoint)
    client.create_bucket(Bucket="s3-evil")
    client.put_object(Bucket="s3-evil", Key="ds/../../escape.txt", Body=b"x")
    service = JobService(load_settings())
    with pytest.raises(ValidationError, match="outside the channel directory"):
        service.create(
            python_job("evil", "print(1)", InputDataConfig=[channel("s3://s3-evil/ds/")])
        )


def test_empty_prefix_on_s3(s3_home: Path, moto_endpoint: str) -> None:
    s3(moto_endpoint).create_bucket(Bucket="s3-empty")
    service = JobService(load_settings())
    with pytest.raises(ValidationError, match="No S3 objects found under S3 URL"):
        service.create(
            python_job("empty", "print(1)", InputDataConfig=[channel("s3://s3-empty/x/")])
        )


def test_unreachable_store_names_the_endpoint(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    service = JobService(load_settings())
    with pytest.raises(StoreError, match=f"cannot reach the S3 endpoint {endpoint}"):
        service.create(python_job("unreach", "print(1)", InputDataConfig=[channel("s3://b/x/")]))


def test_store_conformance(tmp_path: Path, s3_home: Path, moto_endpoint: str) -> None:
    """The local store and the S3 store answer the same calls the same way."""
    from trainport.store.local import LocalStore

    s3(moto_endpoint).create_bucket(Bucket="conf")
    stores = [
        LocalStore(tmp_path / "local"),
        S3Store(endpoint_url=moto_endpoint, region="us-east-1"),
    ]
    for store in stores:
        store.put_bytes("conf", "p/a", b"0123456789")
        store.put_bytes("conf", "p/b/c", b"x")
        store.put_bytes("conf", "q", b"y")
        assert [(o.key, o.size) for o in store.list_objects("conf", "p")] == [
            ("p/a", 10),
            ("p/b/c", 1),
        ]
        assert store.get_bytes("conf", "p/a") == b"0123456789"
        assert store.read_range("conf", "p/a", 2, 5) == b"234"
        assert store.exists("conf", "q") and not store.exists("conf", "nope")
        store.download("conf", "p/b/c", tmp_path / "dl" / "c")
        assert (tmp_path / "dl" / "c").read_bytes() == b"x"
        store.delete("conf", "q")
        assert not store.exists("conf", "q")
        assert store.list_objects("no-such-bucket", "") == []
