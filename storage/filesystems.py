"""A results URI as a pyarrow filesystem whose every network wait is bounded.

``--results`` is a local path or a URI. The URI schemes swapcheck accepts, and what each becomes:

* ``file:///absolute/path`` -- the local filesystem (``file://relative`` is refused: a file URI's
  path is absolute; give a plain path for a relative one).
* ``s3://bucket/prefix`` -- ``pyarrow.fs.S3FileSystem``, configured as pyarrow's own
  ``FileSystem.from_uri`` configures it (the URI's query options ``region``, ``endpoint_override``,
  ``scheme``, ...; endpoint and credentials from the standard environment), plus timeouts: a connect
  timeout, a request timeout (on Linux the AWS SDK's "low speed" limit: a request that transfers
  nothing for that long fails) and at most :data:`ATTEMPTS` attempts per call. Without a region or
  endpoint pyarrow asks S3 where the bucket lives (a ``HeadBucket`` with no timeout of its own): that
  call runs under the same bound.
* ``gs://bucket/prefix`` (``gcs://``) -- ``pyarrow.fs.GcsFileSystem`` from the URI, with its retry
  time limit set (pyarrow's default retries a call for 15 minutes).

Any other scheme (``hdfs://``, ``abfs://``, a typo) is refused with :class:`StorageError` (exit 2)
before anything is opened: swapcheck cannot bound their waits, and a misspelt scheme should not
reach a JVM loader. Credentials in a URI (``s3://key:secret@bucket``) are refused too: they would be
echoed in messages and recorded with the results; the environment is where they belong.

The bound: every call to the store gets an answer or fails within about ``SWAPCHECK_STORE_TIMEOUT_S``
seconds (default :data:`DEFAULT_TIMEOUT_S`), retries included; it fails with pyarrow's ``OSError``
(``TimeoutError`` for the region lookup), the same type as any other fault of the store, so callers
treat an unreachable store like a full disk (the sweep stops, exit 3).
"""

from __future__ import annotations

import math
import os
import threading
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pyarrow.fs as pafs

from storage.errors import StorageError
from swapcheck_common.env import seconds_from_env

__all__ = ["ATTEMPTS", "DEFAULT_TIMEOUT_S", "SCHEMES", "TIMEOUT_ENV", "filesystem_from_uri", "store_timeout_s"]

#: The environment variable that bounds one call to an object store, retries included (seconds).
TIMEOUT_ENV = "SWAPCHECK_STORE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30.0
#: Attempts of one S3 call (AWS's standard retry strategy: exponential back-off between them).
ATTEMPTS = 3
#: The longest an S3 connection attempt may take (a reachable endpoint answers in milliseconds).
CONNECT_TIMEOUT_S = 5.0

#: Schemes of ``--results`` URIs swapcheck opens (what each becomes: module docstring).
SCHEMES = ("file", "s3", "gs", "gcs")
_ALLOWED = "a directory, file:///absolute/path, s3://bucket/prefix or gs://bucket/prefix"


def store_timeout_s() -> float:
    """The bound on one object-store call, from ``SWAPCHECK_STORE_TIMEOUT_S`` (3 to 3600 s; default 30 s):
    S3 gets :data:`ATTEMPTS` attempts of a third of it each (whole seconds, at least one)."""
    return seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, 3.0, 3600.0, StorageError)


def filesystem_from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path inside it)`` for a results URI, every network wait bounded (module docstring).

    Raises :class:`StorageError` (exit 2) for a URI swapcheck does not open (another scheme, a
    relative ``file://`` path, credentials in the URI, an unknown query option), and ``OSError``
    when the store cannot be reached in time to configure it (S3's bucket-region lookup).
    """
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise StorageError(f"--results {uri}: the scheme {parts.scheme + '://'!r} is not supported; give {_ALLOWED}")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StorageError(f"--results {uri}: a file URI names an absolute path (file:///path, three slashes); "
                               f"for a path relative to the current directory give it without file://")
        return pafs.LocalFileSystem(), parts.path.rstrip("/") or "/"
    if "@" in parts.netloc and parts.netloc.split("@", 1)[0] not in ("", "anonymous"):
        raise StorageError(f"--results {parts.scheme}://...@{parts.netloc.split('@', 1)[1]}{parts.path}: credentials in "
                           "the URI are not accepted (they would be echoed and recorded); set them in the environment "
                           "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS)")
    if not parts.netloc:
        raise StorageError(f"--results {uri}: no bucket; give {parts.scheme}://bucket/prefix")
    timeout = store_timeout_s()
    if scheme == "s3":
        return _s3(uri, parts.query, timeout)
    return _gcs(uri, parts, timeout)


def _from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's own parse of the URI; an option it rejects is bad input (exit 2)."""
    import pyarrow as pa

    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, ValueError) as exc:  # an unknown query option, a malformed URI
        raise StorageError(f"--results {uri}: {exc}") from None
    return fs, str(path)


def _s3(uri: str, query: str, timeout: float) -> tuple[pafs.FileSystem, str]:
    options = dict(parse_qsl(query))
    endpoint = options.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if "region" in options or endpoint:
        fs, path = _from_uri(uri)  # nothing to look up: no network call
    else:
        # pyarrow asks S3 for the bucket's region (HeadBucket, its own timeouts unset): bounded here.
        fs, path = _bounded(lambda: _from_uri(uri), timeout,
                            f"could not reach S3 within {timeout:g} s to find the region of the bucket of {uri} "
                            f"(set AWS_DEFAULT_REGION and ?region=..., or raise {TIMEOUT_ENV})")
    kwargs: dict[str, Any] = dict(fs.__reduce__()[1][0])  # the options from_uri chose (pickling's view of them)
    # On Linux the request timeout is curl's low-speed time, in whole seconds (0 would switch it off).
    per_attempt = max(1.0, float(math.floor(timeout / ATTEMPTS)))
    kwargs.update(connect_timeout=min(CONNECT_TIMEOUT_S, per_attempt), request_timeout=per_attempt,
                  retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=ATTEMPTS))
    return pafs.S3FileSystem(**kwargs), path


def _gcs(uri: str, parts: Any, timeout: float) -> tuple[pafs.FileSystem, str]:
    query = parse_qsl(parts.query)
    if not any(k == "retry_limit_seconds" for k, _ in query):
        query.append(("retry_limit_seconds", f"{timeout:g}"))
    bounded = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))
    fs, path = _from_uri(bounded)
    if not isinstance(fs, pafs.GcsFileSystem):  # pragma: no cover - pyarrow maps gs:// to GCS
        raise StorageError(f"--results {uri}: not a GCS filesystem ({type(fs).__name__})")
    limit = fs.__reduce__()[1][0].get("retry_time_limit")
    if limit is None or limit > timedelta(seconds=3600):
        raise StorageError(f"--results {uri}: retry_limit_seconds must be at most 3600")
    return fs, path


def _bounded(call: Any, timeout: float, message: str) -> Any:
    """``call()`` in a daemon thread; its result within ``timeout`` s, else ``TimeoutError(message)``
    (the thread is abandoned: it holds no lock and writes nothing)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="swapcheck-store-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(message)
    if "error" in box:
        raise box["error"]
    return box["value"]
