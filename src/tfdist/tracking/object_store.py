"""A team's object store (S3 and what speaks its API: SeaweedFS, MinIO, Ceph): checked in seconds, one line if wrong.

The DVC remote and the tracking server's artifacts live there. Before either
is used, :func:`check_bucket` lists one key of the bucket with short timeouts
and no retries, so a wrong endpoint, wrong credentials or a missing bucket
fail at once, naming the URL (credentials never: they come from the
environment, AWS's files or DVC's local config, and stay out of messages),
instead of after a training or inside boto3's traceback.

boto3 is the ``s3`` extra's; it is imported only here, when a check runs.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from dataclasses import dataclass

from tfdist.errors import InputError
from tfdist.tracking.store import redact

#: Where boto3 (MLflow's artifact client) looks for a non-AWS endpoint.
MLFLOW_ENDPOINT_ENV = "MLFLOW_S3_ENDPOINT_URL"
#: boto3's settings (environment) for a server in front of the store: one attempt, the client retries.
FAIL_FAST_ENV = {"AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}
#: Seconds to connect and to read before an endpoint is declared unreachable.
CHECK_TIMEOUT = 5.0
#: S3's error codes for credentials it does not accept, and the fix for each.
_CREDENTIAL_ERRORS = {
    "InvalidAccessKeyId": "the access key is unknown there",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "AccessDenied": "these credentials may not list it",
    "403": "the credentials are refused",
    "Forbidden": "the credentials are refused",
}
_FIX_CREDENTIALS = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to keys the store accepts"


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix`` split, with the endpoint that serves it (None: AWS's own)."""

    bucket: str
    prefix: str
    endpoint_url: str | None = None

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def where(self) -> str:
        """The URL as messages show it: with its endpoint, credentials in either hidden."""
        return self.url + (f" at {redact(self.endpoint_url)}" if self.endpoint_url else "")


def parse_s3_url(url: str, endpoint_url: str | None = None, what: str = "the S3 URL") -> S3Location:
    """``s3://bucket/prefix`` as an :class:`S3Location`, or InputError naming ``what``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise InputError(f"{what} {url!r} is not an S3 URL; give s3://BUCKET/PREFIX")
    if endpoint_url is not None and urllib.parse.urlsplit(endpoint_url).scheme not in ("http", "https"):
        raise InputError(f"{what}'s endpoint {redact(endpoint_url)!r} is not an http(s):// URL; "
                         "give e.g. http://127.0.0.1:8333")
    return S3Location(parts.netloc, parts.path.strip("/"), endpoint_url or None)


def client(location: S3Location, *, access_key: str | None = None, secret_key: str | None = None,
           timeout: float = CHECK_TIMEOUT):
    """A boto3 S3 client for ``location``: short timeouts, one attempt, credentials given or boto3's own chain.

    One attempt is ``total_max_attempts``: botocore's ``max_attempts`` counts the retries after the first request.
    """
    try:
        import boto3
        from botocore.config import Config as BotoConfig
        logging.getLogger("botocore.credentials").setLevel(logging.WARNING)  # not "Found credentials in ..."
    except ImportError:
        raise InputError(f"{location.where}: boto3 is not installed; install the s3 extra: pip install -e '.[s3]'") from None
    return boto3.client(
        "s3", endpoint_url=location.endpoint_url, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        region_name=os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1",
        config=BotoConfig(connect_timeout=timeout, read_timeout=timeout, retries={"total_max_attempts": 1, "mode": "standard"}),
    )


def check_bucket(location: S3Location, what: str, *, access_key: str | None = None, secret_key: str | None = None
                 ) -> None:
    """List one key under ``location``: InputError in one line when the store cannot be used, naming ``what`` and the fix."""
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

    s3 = client(location, access_key=access_key, secret_key=secret_key)
    try:
        s3.list_objects_v2(Bucket=location.bucket, Prefix=location.prefix, MaxKeys=1)
    except NoCredentialsError:
        raise InputError(f"{what} {location.where}: no credentials; {_FIX_CREDENTIALS}") from None
    except ClientError as err:
        code = str(err.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket", "404", "NotFound"):
            raise InputError(f"{what} {location.where}: there is no bucket {location.bucket!r}; create it "
                             f"(tfdist s3 creates it on the local store) or fix the URL") from None
        if code in _CREDENTIAL_ERRORS:
            raise InputError(f"{what} {location.where}: {_CREDENTIAL_ERRORS[code]}; {_FIX_CREDENTIALS}") from None
        raise InputError(f"{what} {location.where}: the store answers {code or err}") from None
    except EndpointConnectionError:
        raise InputError(f"{what} {location.where}: no S3 store answers there; start it (tfdist s3) or fix the "
                         "endpoint") from None
    except BotoCoreError as err:
        raise InputError(f"{what} {location.where}: the store cannot be used ({type(err).__name__}); check the "
                         "endpoint") from None
