"""A real store that counts the requests made on it: what a test of store load asserts on."""

from __future__ import annotations

from typing import Any


class CountingStore:
    """Wraps a real store (a TCPStore, a PrefixStore over one); every method call counts as one request."""

    def __init__(self, store: Any) -> None:
        self.store, self.requests = store, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.requests += 1
            return attr(*args, **kwargs)

        return call
