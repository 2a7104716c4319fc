"""The boto3 client of the S3 tier and the translation of botocore failures into
CacheErrors that name the endpoint, the action and the reason, and never a secret.

Only engine_cache.s3 imports this module: `import engine_cache` works without boto3."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager

import boto3
import botocore.exceptions
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from engine_cache.errors import CacheError, S3Unreachable, redact
from engine_cache.location import resolve_endpoint

MiB = 1 << 20
# Parallel ranged GETs / multipart uploads of 8 MiB parts (s3transfer grows them for files
# that would need more than 10,000), read from the socket in 4 MiB chunks: measured here,
# boto3's default 256 KiB chunks cost about twice the client CPU per byte, which is what pays
# for the sha256 of every byte. The hash follows the gap-free prefix, so at most about
# max_concurrency parts are left to hash after the last byte arrives: smaller parts, shorter
# tail (16 MiB parts measured slower). At most 32 chunks wait for the writer thread.
DEFAULT_TRANSFER = TransferConfig(
    multipart_threshold=8 * MiB,
    multipart_chunksize=8 * MiB,
    max_concurrency=10,
    io_chunksize=4 * MiB,
    max_io_queue=32,
    use_threads=True,
)
NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
CONFLICT = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}


class S3Client:
    """A boto3 client plus what error messages need: its endpoint and the secrets to hide."""

    def __init__(self, endpoint_url: str | None):
        endpoint = resolve_endpoint(endpoint_url)  # refuses credentials in the URL
        self.endpoint = endpoint or "AWS S3"
        self.secrets: tuple[str, ...] = ()
        with self.call("connecting"):
            session = boto3.session.Session()  # a bad AWS_PROFILE fails here
            self.client = session.client(
                "s3", endpoint_url=endpoint, region_name=_region(), config=_config(endpoint)
            )
            self.endpoint = self.client.meta.endpoint_url
            self.secrets = _secrets_of(session)

    @contextmanager
    def call(self, action: str) -> Iterator[None]:
        try:
            yield
        except (
            botocore.exceptions.EndpointConnectionError,
            botocore.exceptions.ConnectTimeoutError,
            botocore.exceptions.ReadTimeoutError,
            botocore.exceptions.ConnectionClosedError,
        ) as e:
            raise S3Unreachable(
                self._hide(
                    f"S3 endpoint {self.endpoint} is unreachable while {action} ({e}); check the "
                    "endpoint and the network, or set engine_cache.local_only to carry on with "
                    "the local tier"
                )
            ) from e
        except botocore.exceptions.NoCredentialsError as e:
            raise CacheError(
                f"no S3 credentials for {self.endpoint} while {action}: set "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or another "
                "source of the standard credential chain"
            ) from e
        except botocore.exceptions.ClientError as e:
            # Only the code and message: the rest of the response (StringToSign, the
            # request id) is of no use to a reader.
            error = e.response.get("Error", {})
            raise CacheError(
                self._hide(
                    f"S3 {self.endpoint} refused {action}: "
                    f"{error.get('Code')} {error.get('Message', '')}".rstrip()
                )
            ) from e
        except botocore.exceptions.BotoCoreError as e:
            raise CacheError(self._hide(f"S3 {self.endpoint} failed while {action}: {e}")) from e

    def _hide(self, message: str) -> str:
        return redact(message, self.secrets)


def error_code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def _config(endpoint: str | None) -> Config:
    return Config(
        connect_timeout=5,
        read_timeout=120,
        retries={
            "max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS", "3")),
            "mode": os.environ.get("AWS_RETRY_MODE", "standard"),
        },
        # Custom endpoints (SeaweedFS, MinIO, a loopback address) rarely resolve
        # bucket-named hosts: address buckets by path there.
        s3={"addressing_style": "path" if endpoint else "auto"},
        max_pool_connections=32,
    )


def _secrets_of(session) -> tuple[str, ...]:
    """The secret key and token the client signs with, wherever they came from (a profile
    file too), so that no message can quote them. The session resolved them already."""
    credentials = session.get_credentials()
    if credentials is None:
        return ()
    frozen = credentials.get_frozen_credentials()
    return tuple(s for s in (frozen.secret_key, frozen.token) if s)


def wait_all(futures: list[Future]) -> None:
    """Wait for every transfer; the first failure is raised after all have settled."""
    first_error = None
    for future in futures:
        try:
            future.result()
        except Exception as e:  # noqa: BLE001 - re-raised below, after the others
            first_error = first_error or e
    if first_error is not None:
        raise first_error
