"""The S3 server the object-storage tests run against answers signed requests only."""

import boto3
import pytest
from botocore.exceptions import ClientError


def test_the_server_checks_signatures(s3):
    bucket = s3.make_bucket("server-check")
    s3.client().put_object(Bucket=bucket, Key="a/b.txt", Body=b"hello")
    assert s3.client().get_object(Bucket=bucket, Key="a/b.txt")["Body"].read() == b"hello"
    stranger = boto3.client(
        "s3", endpoint_url=s3.endpoint, aws_access_key_id="nobody", aws_secret_access_key="x", region_name="us-east-1"
    )
    with pytest.raises(ClientError, match="InvalidAccessKeyId"):
        stranger.list_objects_v2(Bucket=bucket)
