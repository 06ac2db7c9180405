"""Reading a store's objects with limits: network timeouts, and byte caps applied while reading.

A store is someone else's server. One that accepts a connection and never answers would
otherwise hold ``pull`` or ``ls URL`` for aiohttp's default five minutes; an index record or
marker of 600 MB would be read whole before its size was checked. So every backend gets a
connect and a read timeout (``FI_AUTOTUNE_STORE_TIMEOUT`` seconds, default 30; connecting waits
at most 10), and small objects are read through ``read_capped``: at most ``limit + 1`` bytes,
never the whole object, and on a file:// store never a FIFO or a device.

A timeout per read does not bound a server that trickles (one byte every 5 s keeps every read
alive: a 64 KB marker would take 91 hours). So each request also has a deadline for the whole
of it (``deadline``), counted from its first byte sent - connecting, the status line and
headers, and the body alike: twice the timeout, for connecting and the first bytes, plus its size
(or byte cap) at ``MIN_RATE``; past it the request fails, naming the URL and the limit.
"""

from __future__ import annotations

import math
import os
import time

from autotune_cache.autotuner.rankfile import read_regular_file
from autotune_cache.errors import UsageError

TIMEOUT_ENV = "FI_AUTOTUNE_STORE_TIMEOUT"
DEFAULT_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0
HTTP_PROTOCOLS = ("http", "https")
GCS_PROTOCOLS = ("gs", "gcs")


#: The slowest average rate a request may keep after its first ``--timeout`` seconds (bytes/s).
MIN_RATE = 256 << 10


class TooLarge(ValueError):
    """An object over its cap (only ``limit + 1`` bytes of it were read)."""


class DeadlinePassed(TimeoutError):
    """A request that kept answering, too slowly to end within its deadline."""


#: A listing's byte budget for its deadline: a listing is several requests (pages of an object
#: store, directory pages of an HTTP store), bounded together as one of this size.
LISTING_BYTES = 2 << 20


def deadline(timeout: float, size: int) -> float:
    """Seconds one request of ``size`` bytes (its size, or its byte cap) may take in all: twice
    the timeout for connecting and the first bytes (a silent server fails its read timeout
    first, and is named as silent), then the bytes at ``MIN_RATE``."""
    return 2 * timeout + size / MIN_RATE


def describe_deadline(timeout: float, size: int) -> str:
    return (f"not done within {deadline(timeout, size):.3g} s (twice the {timeout:g} s timeout, plus {size} bytes "
            f"at {MIN_RATE >> 10} KiB/s)")


def bounded(fs, fn, *args, timeout: float, size: int, **kwargs):
    """``fn(*args, **kwargs)``, one request of ``fs``, ended at its deadline: fsspec's own for an
    asynchronous backend (HTTP, S3, GCS: the request is cancelled); a local one has no network."""
    if not getattr(fs, "async_impl", False):
        return fn(*args, **kwargs)
    from fsspec.exceptions import FSTimeoutError  # fsspec is there: ``fs`` is one of its filesystems

    try:
        return fn(*args, timeout=deadline(timeout, size), **kwargs)
    except FSTimeoutError:
        raise DeadlinePassed(describe_deadline(timeout, size)) from None


def store_timeout(given: float | None = None) -> float:
    """Seconds a store may stay silent: ``given`` (a command's ``--timeout``), else the
    environment's ``FI_AUTOTUNE_STORE_TIMEOUT``, else the default. The one place that decides."""
    if given is not None:
        if not 0 < given < math.inf:
            raise UsageError(f"--timeout {given:g}: give a number of seconds above 0")
        return float(given)
    return env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT, zero_ok=False)


def env_seconds(name: str, default: float, *, zero_ok: bool) -> float:
    """Seconds from the environment variable ``name`` (``FI_AUTOTUNE_STORE_TIMEOUT``,
    ``FI_AUTOTUNE_STORE_GRACE``), ``default`` where it is unset or blank. A finite number above
    0, or with ``zero_ok`` 0 or more; anything else (a word, a negative, nan, inf) is a usage
    error naming the variable and its value - one line, exit 2 - never a guess at what was
    meant. The one parser of them, so both say the same."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    low_ok = 0 <= value if zero_ok else 0 < value  # nan fails both
    if not (low_ok and value < math.inf):
        raise UsageError(f"{name}={raw!r}: give a number of seconds " + ("(0 or more)" if zero_ok else "above 0"))
    return value


def set_store_timeout(seconds: float) -> None:
    """A command's ``--timeout``: checked, then made what ``store_timeout`` answers for the
    rest of this process and its children (warm's workers push too), so every store the
    command opens - whichever library function opens it - waits the same."""
    os.environ[TIMEOUT_ENV] = repr(store_timeout(seconds))


def timeout_options(scheme: str, timeout: float) -> dict:
    """fsspec storage options that bound connecting and each read, per backend."""
    connect = min(CONNECT_TIMEOUT, timeout)
    if scheme in HTTP_PROTOCOLS + GCS_PROTOCOLS:
        import aiohttp  # fsspec's HTTP backend and gcsfs need it: missing, url_to_fs names the extra

        limits = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=timeout)
        # gcsfs passes ``requests_timeout`` as each request's ``timeout`` (an aiohttp ClientTimeout)
        return {"requests_timeout": limits} if scheme in GCS_PROTOCOLS else {"client_kwargs": {"timeout": limits}}
    if scheme in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": connect, "read_timeout": timeout}}
    return {}  # file:// has no network


def is_timeout(e: BaseException) -> bool:
    """A backend's timeout, however it is wrapped (FSTimeoutError, ServerTimeoutError,
    botocore's ReadTimeoutError, a FileNotFoundError caused by one)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if "Timeout" in type(e).__name__ or isinstance(e, TimeoutError):
            return True
        e = e.__cause__ or e.__context__
    return False


def is_missing(e: BaseException) -> bool:
    """Backends report a missing object in their own ways (HTTP 404, ClientError NoSuchKey) -
    and fsspec's HTTP backend reports an unreachable server as FileNotFoundError too, with the
    connection error as its cause; that one is not "missing"."""
    cause = e.__cause__ or e.__context__
    if cause is not None and any(s in type(cause).__name__ for s in ("Connect", "Timeout", "OSError", "ClientOS")):
        return False
    if isinstance(e, FileNotFoundError):
        return True
    text = f"{type(e).__name__} {e}"
    return any(s in text for s in ("404", "NoSuchKey", "Not Found", "NotFound"))


def read_capped(fs, path: str, limit: int, *, local: bool, protocol: str, timeout: float) -> bytes:
    """At most ``limit`` bytes of one object; ``TooLarge`` past it, having read ``limit + 1``.
    A local file is opened without blocking and must be regular; an HTTP body is streamed (a
    server may ignore a Range header), its deadline checked as each piece arrives; other
    backends check the object's size, then read a byte range, each request with its deadline."""
    if local:
        try:
            return read_regular_file(path, limit=limit)
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise
            if "larger than" in str(e):
                raise TooLarge(f"larger than {limit} bytes") from None
            raise
    if protocol in HTTP_PROTOCOLS:
        data = _http_capped(fs, path, limit, timeout)
    else:
        # The size first (one HEAD: a silent server fails it within one timeout per retry, where
        # s3fs retries a ranged GET far longer), then at most limit + 1 bytes of the body.
        size = bounded(fs, fs.size, path, timeout=timeout, size=0)
        if size is not None and size > limit:
            raise TooLarge(f"larger than {limit} bytes")
        data = bounded(fs, fs.cat_file, path, start=0, end=limit + 1, timeout=timeout, size=limit + 1)
    if len(data) > limit:
        raise TooLarge(f"larger than {limit} bytes")
    return data


def _http_capped(fs, path: str, limit: int, timeout: float) -> bytes:
    """One GET, at most ``limit + 1`` bytes of its body, the whole of it - connecting, the status
    line and headers, the body - under one deadline from the first byte sent: a server that
    trickles its headers (one byte every 0.5 s keeps each read alive) is cut off as one that
    trickles its body is. A stream's read returns what has arrived: read on to the end or the cap."""
    import asyncio

    from fsspec.asyn import sync

    async def get() -> bytes:
        session = await fs.set_session()
        async with session.get(fs.encode_url(path), **fs.kwargs) as r:
            fs._raise_not_found_for_status(r, path)
            chunks, got = [], 0
            while got <= limit:
                chunk = await r.content.read(limit + 1 - got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)

    async def within_deadline() -> bytes:
        # not wait_for: aiohttp's own timeouts are asyncio.TimeoutError too (a silent server is
        # named as silent); the deadline is told apart, and cancels the request
        task = asyncio.ensure_future(get())
        done, _ = await asyncio.wait({task}, timeout=deadline(timeout, limit + 1))
        if not done:
            task.cancel()
            await asyncio.wait({task})
            raise DeadlinePassed(describe_deadline(timeout, limit + 1))
        return task.result()

    try:
        return sync(fs.loop, within_deadline)
    except Exception as e:  # noqa: BLE001 - fsspec's sync wraps every asyncio timeout as its own
        if isinstance(e.__cause__, DeadlinePassed):
            raise e.__cause__ from None
        raise
