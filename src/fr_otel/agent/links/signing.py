"""The job's records signed with a secret the store never carries: what does not verify is not this job's.

The TCPStore and a node's folder take writes from anything that reaches them. With a per-job secret
(``FR_OTEL_JOB_SECRET``, or ``FR_OTEL_JOB_SECRET_FILE`` naming a file that holds it: ``fr-otel run`` makes one
for a single-node job, a multi-node launcher hands one to every rank), every value an agent writes carries an
HMAC-SHA256 over its key's name and its bytes (:meth:`Seal.sign`), and every value read is verified
(:meth:`Seal.open`): a forged value, or one moved to another key, reads as absent. Counters (``add``) cannot
be signed; nothing is decided on one alone (a count read is only when to look, what is looked at is signed).
Without a secret the agent works as before, and says once that its records are unauthenticated.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from ...common.files import read_regular
from ...common.log import logger

__all__ = ["JOB_SECRET_ENV", "JOB_SECRET_FILE_ENV", "SEAL_BYTES", "Seal", "job_secret", "new_secret"]

JOB_SECRET_ENV = "FR_OTEL_JOB_SECRET"
JOB_SECRET_FILE_ENV = "FR_OTEL_JOB_SECRET_FILE"
#: A secret shorter than this is refused (guessable); a secret file larger than this is not one.
MIN_SECRET_CHARS = 16
_MAX_SECRET_FILE = 4096
_MAGIC = b"frs1"
_TAG = 32  # bytes of an HMAC-SHA256
#: What signing adds to a value (a reader's bound on a signed value is its bound on the value plus this).
SEAL_BYTES = len(_MAGIC) + _TAG

log = logger("fr_otel.agent")


def new_secret() -> str:
    """A fresh job secret (256 bits, hex: safe in an environment variable and a scheduler's ``--export``)."""
    return secrets.token_hex(32)


class Seal:
    """Signs and verifies the job's records under one secret, bound to one job's keys (``context``)."""

    def __init__(self, secret: bytes, context: str = "") -> None:
        self._key = hashlib.sha256(b"fr-otel job secret\0" + secret).digest()
        self._context = context.encode("utf-8", "surrogatepass") + b"\0"

    def _tag(self, key: str, value: bytes) -> bytes:
        return hmac.new(self._key, self._context + key.encode("utf-8", "surrogatepass") + b"\0" + value,
                        hashlib.sha256).digest()

    def sign(self, key: str, value: bytes) -> bytes:
        """``value`` as written under ``key``: a marker, its tag, then the value itself."""
        return _MAGIC + self._tag(key, value) + value

    def open(self, key: str, blob: bytes) -> bytes | None:
        """The value :meth:`sign` wrote under ``key``; None when ``blob`` is not one (forged, moved, unsigned)."""
        if len(blob) < len(_MAGIC) + _TAG or not blob.startswith(_MAGIC):
            return None
        tag, value = blob[len(_MAGIC): len(_MAGIC) + _TAG], blob[len(_MAGIC) + _TAG:]
        return value if secrets.compare_digest(tag, self._tag(key, value)) else None


def job_secret(env: dict[str, str] | os._Environ[str] = os.environ) -> bytes | None:
    """This job's secret from the environment (the variable, else the file it names); None without one, or
    (one line) when the one named cannot be used: the agent then works unauthenticated."""
    text = env.get(JOB_SECRET_ENV, "")
    source = JOB_SECRET_ENV
    path = env.get(JOB_SECRET_FILE_ENV, "")
    if not text and path:
        source = f"{JOB_SECRET_FILE_ENV} ({path})"
        try:
            text = read_regular(path, _MAX_SECRET_FILE).decode("utf-8", "replace").strip()
        except OSError as exc:
            log.warning("%s cannot be read (%s): this job's store records are unauthenticated", source,
                        exc.strerror or exc)
            return None
    if not text:
        return None
    if len(text) < MIN_SECRET_CHARS:
        log.warning("%s holds %d characters, fewer than %d: not used; this job's store records are "
                    "unauthenticated", source, len(text), MIN_SECRET_CHARS)
        return None
    return text.encode("utf-8", "surrogatepass")
