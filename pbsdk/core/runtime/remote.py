"""A remote tier behind the local compile cache, shared by many machines (``PBSDK_CACHE_URL``).

Lookups go local, then remote; a remote hit is written to the local directory, so the next lookup is
local. New entries are written to both. What travels is code and metadata: an entry's bytes describe its
constants (shape, dtype, digest) without holding them, a host JIT's object files, and the constants the
compiler made (weights packed at compile time, each by its digest, each at most `MAX_REMOTE_BYTES`). The
caller's own weights never travel: a lookup that passes them uses them, one that does not finds them in
the local weight store or misses. The keys are the local cache's (`cache_key`, the
object keys), under a namespace with the entry format's version; the bytes carry the same checksums, which
the local cache checks on every remote read as on a local one.

The remote can only make compiles fewer, never fail one or return a wrong kernel: a server that is down or
slow (each request times out after `TIMEOUT_S`) or that answers with bytes that fail their checksum is
reported by one warning, and the tier is left alone for `RETRY_S` before it is tried again (a damaged
entry is deleted there too). Today's scheme: ``redis://``, ``rediss://`` and ``unix://`` URLs (the
``redis`` package: ``pip install pbsdk[remote]``).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any, Protocol

from pbsdk.core.errors import CacheWarning

#: Seconds a request may take (connect, read or write) before the remote counts as down.
TIMEOUT_S = 1.0
#: Seconds a tier that failed is left alone before the next request tries it again.
RETRY_S = 60.0
#: Largest entry written to the remote (bytes); larger ones stay local.
MAX_REMOTE_BYTES = 64 << 20


class RemoteTier(Protocol):
    """What the local cache asks of a remote: bytes by key, None when absent or unreachable."""

    url: str

    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, blob: bytes) -> bool: ...
    def delete(self, key: str) -> None: ...
    def failed(self, why: str) -> None: ...


class RedisTier:
    """The remote tier on a Redis server. Thread-safe (redis-py's client pools its connections)."""

    def __init__(self, url: str, namespace: str, *, timeout_s: float = TIMEOUT_S, retry_s: float = RETRY_S) -> None:
        import redis

        self.url, self.namespace, self.retry_s = url, namespace, retry_s
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._errors: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)
        self._lock = threading.Lock()
        self._down_until = 0.0
        self.failures = 0
        self.warned = 0

    def __repr__(self) -> str:
        return f"RedisTier({self.url!r})"

    def _key(self, key: str) -> str:
        return f"{self.namespace}:{key}"

    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def failed(self, why: str) -> None:
        """Leave the tier alone for `retry_s`, with one warning per outage."""
        with self._lock:
            self.failures += 1
            first = self.available()
            self._down_until = time.monotonic() + self.retry_s
        if first:
            self.warned += 1
            warnings.warn(f"pbsdk cache: the remote tier {self.url} {why}; compiling locally (retried in "
                          f"{self.retry_s:.0f} s)", CacheWarning, stacklevel=4)

    def get(self, key: str) -> bytes | None:
        if not self.available():
            return None
        try:
            value = self._client.get(self._key(key))
        except self._errors as exc:
            self.failed(f"is unreachable ({type(exc).__name__}: {exc})")
            return None
        return value if isinstance(value, bytes) else None

    def put(self, key: str, blob: bytes) -> bool:
        if not self.available() or len(blob) > MAX_REMOTE_BYTES:
            return False
        try:
            self._client.set(self._key(key), blob)
        except self._errors as exc:
            self.failed(f"is unreachable ({type(exc).__name__}: {exc})")
            return False
        return True

    def delete(self, key: str) -> None:
        if not self.available():
            return
        try:
            self._client.delete(self._key(key))
        except self._errors as exc:
            self.failed(f"is unreachable ({type(exc).__name__}: {exc})")


_tiers: dict[tuple[str, str], Any] = {}
_tiers_lock = threading.Lock()


def remote_from_env(namespace: str) -> RemoteTier | None:
    """The remote tier ``PBSDK_CACHE_URL`` names (one per URL and process), or None: unset, or unusable
    (an unknown scheme, the ``redis`` package missing: one warning)."""
    url = os.environ.get("PBSDK_CACHE_URL", "").strip()
    if not url:
        return None
    with _tiers_lock:
        if (url, namespace) in _tiers:
            return _tiers[(url, namespace)]  # type: ignore[no-any-return]
        tier: RemoteTier | None = None
        if not url.startswith(("redis://", "rediss://", "unix://")):
            warnings.warn(f"pbsdk cache: PBSDK_CACHE_URL={url!r}: only redis://, rediss:// and unix:// URLs "
                          "are supported; no remote tier", CacheWarning, stacklevel=3)
        else:
            try:
                tier = RedisTier(url, namespace)
            except ImportError:
                warnings.warn("pbsdk cache: PBSDK_CACHE_URL needs the redis package (pip install pbsdk[remote]); "
                              "no remote tier", CacheWarning, stacklevel=3)
            except ValueError as exc:
                warnings.warn(f"pbsdk cache: PBSDK_CACHE_URL={url!r}: {exc}; no remote tier", CacheWarning,
                              stacklevel=3)
        _tiers[(url, namespace)] = tier
        return tier


__all__ = ["MAX_REMOTE_BYTES", "RETRY_S", "TIMEOUT_S", "RedisTier", "RemoteTier", "remote_from_env"]
