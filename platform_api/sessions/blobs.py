"""The blob store port: where the audio of recordings lives (not the FHIR store).

A FHIR resource holds what is known about a recording (a ``Media``, see
:mod:`.recordings`); its bytes are objects in a blob store under keys such as
``recordings/<media id>/part-00001``. Two adapters, chosen by
``HEALTHPLATFORM_BLOB_STORE``:

- :class:`LocalBlobStore` (default): a directory, ``<data_dir>/blobs`` unless a path is
  given; an object is a file, written to a temporary file beside it and renamed into
  place, so a reader never sees half an object;
- :class:`S3BlobStore` (``s3://bucket[/prefix]``): any S3-compatible service (AWS S3,
  MinIO, Ceph, ...) through ``boto3``, the endpoint and credentials from the settings;
  boto3's transfer manager uploads large objects in parts.

Uploads never hold a body in memory: :func:`spool` streams a request body to a temporary
file on disk while counting and hashing it (SHA-256), and the adapter moves or uploads
that file. Reads stream in chunks (:meth:`BlobStore.chunks`). boto3 is synchronous: its
calls run in worker threads, off the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio

from fhir_server.private_files import FILE_MODE, private_directory
from platform_api.settings import Settings

CHUNK = 1024 * 1024
_SAFE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


class BlobTooLarge(Exception):
    """A body passed the size it was allowed."""

    def __init__(self, limit: int):
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


class BlobMissing(Exception):
    """No object under that key."""


@dataclass(frozen=True, slots=True)
class Spooled:
    """A body written to a temporary file: its path, size and SHA-256 (hex)."""

    path: Path
    size: int
    sha256: str
    head: bytes  # the first bytes, for sniffing the content type


def check_key(key: str) -> str:
    if not _SAFE_KEY.match(key) or ".." in key:
        raise ValueError(f"unsafe blob key {key!r}")
    return key


async def spool(body: AsyncIterator[bytes], directory: Path, limit: int,
                head_bytes: int = 64) -> Spooled:
    """Stream ``body`` into a temporary file in ``directory``, counting and hashing as it
    comes; :class:`BlobTooLarge` (the file removed) past ``limit`` bytes."""
    path = await asyncio.to_thread(_new_spool_file, directory)
    digest, size, head = hashlib.sha256(), 0, b""
    try:
        async with await anyio.open_file(path, "wb") as out:
            async for chunk in body:
                if not chunk:
                    continue
                size += len(chunk)
                if size > limit:
                    raise BlobTooLarge(limit)
                if len(head) < head_bytes:
                    head += chunk[:head_bytes - len(head)]
                digest.update(chunk)
                await out.write(chunk)
    except BaseException:
        await anyio.Path(path).unlink(missing_ok=True)
        raise
    return Spooled(path, size, digest.hexdigest(), head)


def _new_spool_file(directory: Path) -> Path:
    private_directory(directory)
    handle, name = tempfile.mkstemp(prefix="upload-", dir=directory)
    os.close(handle)
    return Path(name)


class BlobStore(Protocol):
    """Objects by key: put a spooled file, read in chunks, delete."""

    async def put_file(self, key: str, path: Path, content_type: str) -> None:
        """Store the file's bytes under ``key`` (the file is consumed: moved or removed)."""
        ...

    def chunks(self, key: str, size: int = CHUNK) -> AsyncIterator[bytes]:
        """The object's bytes in chunks (:class:`BlobMissing` when there is none)."""
        ...

    async def delete(self, key: str) -> None: ...

    @property
    def spool_dir(self) -> Path:
        """Where uploads are spooled before :meth:`put_file` (same file system as the
        objects for the local store, so putting is a rename)."""
        ...


class LocalBlobStore:
    def __init__(self, root: Path):
        self.root = root
        private_directory(self.root)

    @property
    def spool_dir(self) -> Path:
        return self.root / ".spool"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    async def put_file(self, key: str, path: Path, content_type: str) -> None:
        target = self._path(key)
        private_directory(target.parent)
        os.chmod(path, FILE_MODE)  # mkstemp's already; a caller's own file too
        await asyncio.to_thread(os.replace, path, target)

    async def chunks(self, key: str, size: int = CHUNK) -> AsyncIterator[bytes]:
        path = self._path(key)
        try:
            handle = await anyio.open_file(path, "rb")
        except FileNotFoundError:
            raise BlobMissing(key) from None
        async with handle:
            while chunk := await handle.read(size):
                yield chunk

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self._path(key).unlink, True)


class S3BlobStore:
    """An S3 bucket (``prefix`` before every key) through boto3, in worker threads."""

    def __init__(self, bucket: str, prefix: str, spool_dir: Path, *, endpoint_url: str = "",
                 region: str = "us-east-1", access_key_id: str = "",
                 secret_access_key: str = ""):
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix, self._spool = bucket, prefix.strip("/"), spool_dir
        self.client: Any = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url or None, region_name=region,
            aws_access_key_id=access_key_id or None,
            aws_secret_access_key=secret_access_key or None,
            config=Config(retries={"max_attempts": 3, "mode": "standard"}))

    @property
    def spool_dir(self) -> Path:
        return self._spool

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    async def put_file(self, key: str, path: Path, content_type: str) -> None:
        try:
            await asyncio.to_thread(self.client.upload_file, str(path), self.bucket,
                                    self._key(key), ExtraArgs={"ContentType": content_type})
        finally:
            await anyio.Path(path).unlink(missing_ok=True)

    async def chunks(self, key: str, size: int = CHUNK) -> AsyncIterator[bytes]:
        from botocore.exceptions import ClientError

        try:
            answer = await asyncio.to_thread(self.client.get_object, Bucket=self.bucket,
                                             Key=self._key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise BlobMissing(key) from None
            raise
        body = answer["Body"]
        try:
            while chunk := await asyncio.to_thread(body.read, size):
                yield chunk
        finally:
            body.close()

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self.client.delete_object, Bucket=self.bucket,
                                Key=self._key(key))


def blob_store(settings: Settings) -> BlobStore:
    """The adapter the settings choose (module docstring)."""
    where = settings.blob_store
    if where.startswith("s3://"):
        bucket, _, prefix = where[len("s3://"):].partition("/")
        if not bucket:
            raise ValueError("HEALTHPLATFORM_BLOB_STORE=s3://<bucket>[/prefix] needs a bucket")
        return S3BlobStore(bucket, prefix, settings.data_dir / "spool",
                           endpoint_url=settings.blob_s3_endpoint_url,
                           region=settings.blob_s3_region,
                           access_key_id=settings.blob_s3_access_key_id,
                           secret_access_key=settings.blob_s3_secret_access_key)
    return LocalBlobStore(Path(where) if where else settings.data_dir / "blobs")


__all__ = ["BlobMissing", "BlobStore", "BlobTooLarge", "LocalBlobStore", "S3BlobStore",
           "Spooled", "blob_store", "check_key", "spool"]
