"""The S3 server the object-storage tests run against answers signed requests only."""

import pytest
from botocore.exceptions import ClientError


def test_the_server_checks_signatures(s3):
    bucket = s3.make_bucket("server-check")
    s3.client().put_object(Bucket=bucket, Key="a/b.txt", Body=b"hello")
    assert s3.client().get_object(Bucket=bucket, Key="a/b.txt")["Body"].read() == b"hello"
    stranger = s3.client(access_key="nobody", secret_key="x")
    with pytest.raises(ClientError, match="InvalidAccessKeyId"):
        stranger.list_objects_v2(Bucket=bucket)
