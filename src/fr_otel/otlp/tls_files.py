"""TLS files checked before the first dial: one clear line, not a gRPC log storm.

Called by the CLI up front and by the exporter before it dials (not by
:func:`~fr_otel.otlp.config.resolve_export_config`, which only resolves names).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from ..common.text import one_line, printable

if TYPE_CHECKING:
    from .config import ExportConfig

__all__ = ["check_tls_files"]


def check_tls_files(config: ExportConfig) -> None:
    """PEM files that cannot be used are one ValueError line now, not a gRPC log storm at the first dial.

    Called by the CLI up front and by the exporter before it dials (not by
    :func:`resolve_export_config`, which only resolves names).
    """
    import ssl

    ca, key, chain = config.certificate_file, config.client_key_file, config.client_certificate_file
    for path, what in ((ca, "CA certificate"), (key, "client key"), (chain, "client certificate")):
        if path is None:
            continue
        try:  # stat, never open, first: opening a FIFO blocks until someone writes to it
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise ValueError(f"{what} file {printable(path)!r}: not a regular file")
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ValueError(f"{what} file {printable(path)!r}: {exc.strerror or exc}") from None
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if ca is not None:
            context.load_verify_locations(cafile=ca)
        if chain is not None:
            context.load_cert_chain(chain, key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        which = f"CA certificate file {printable(ca)!r}" if ca is not None else "client certificate/key"
        if chain is not None and ca is not None and "cert" not in str(exc).lower():
            which = "client certificate/key"
        raise ValueError(f"{which}: not usable PEM ({one_line(exc, 120)})") from None
