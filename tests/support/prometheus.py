"""A real Prometheus on loopback, for tests of metrics, queries, rules and dashboards.

Starts the ``prometheus`` binary (Debian's 2.42 here) on a free ``127.0.0.1`` port with a
generated config (JSON, which is YAML) scraping the given targets, exemplar storage on
and a throw-away TSDB; waits until it is ready; answers PromQL through the HTTP API::

    with PrometheusServer(["127.0.0.1:9740", "127.0.0.1:9741"], scrape_interval="1s") as prom:
        prom.wait_for_targets(up=2)
        prom.wait_for("fr_inflight_collective_age_seconds > 5", timeout=60)
        rows = prom.query("max by (rank) (fr_last_enqueued_seq)")
        print({r.labels["rank"]: r.value for r in rows})

Stdlib only (no requests); never imports torch. Raises :class:`PrometheusError` with the
server's log tail when it cannot start or a query fails.

Elsewhere than this network namespace (a test's simulated host): ``command_prefix`` runs the
binary through a launcher (``ip netns exec NS``), ``connect`` opens the API's connections from
there (a socket made in that namespace); its ``127.0.0.1`` is then the namespace's own.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from fr_otel.common.files import atomic_write
from fr_otel.common.ports import unused_tcp_port

__all__ = ["Exemplar", "PrometheusError", "PrometheusServer", "Sample", "find_prometheus"]


class PrometheusError(RuntimeError):
    """Prometheus could not start, or answered a query with an error."""


class Sample(NamedTuple):
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float
    timestamp: float


class Exemplar(NamedTuple):
    """One stored exemplar: the series it belongs to and its own labels (e.g. ``trace_id``)."""

    series: dict[str, str]
    labels: dict[str, str]
    value: float
    timestamp: float


def find_prometheus() -> str | None:
    """The ``prometheus`` binary: ``$PROMETHEUS_BIN``, else on PATH, else Debian's /usr/bin."""
    explicit = os.environ.get("PROMETHEUS_BIN")
    if explicit:
        return explicit
    return shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").is_file() else None)


#: Opens a TCP connection to (host, port) within a timeout: how the API is reached.
Connect = Callable[[tuple[str, int], float], socket.socket]


class PrometheusServer:
    """One Prometheus process; use as a context manager (or ``start()``/``stop()``).

    ``targets``: ``host:port`` strings scraped as job ``job``; ``labels`` are added to all
    of them. ``rule_files`` are loaded (evaluated every ``evaluation_interval``).
    ``command_prefix`` and ``connect``: run and reach it in another network namespace.
    """

    def __init__(
        self,
        targets: Sequence[str] = (),
        *,
        job: str = "fr-otel",
        labels: Mapping[str, str] | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str | None = None,
        rule_files: Iterable[str | os.PathLike[str]] = (),
        features: Sequence[str] = ("exemplar-storage",),
        binary: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 30.0,
        command_prefix: Sequence[str] = (),
        connect: Connect | None = None,
    ) -> None:
        self.targets = list(targets)
        self.job = job
        self.labels = dict(labels or {})
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval or scrape_interval
        self.rule_files = [str(Path(p).resolve()) for p in rule_files]
        self.features = list(features)
        self.binary = binary or find_prometheus()
        self._workdir_arg = workdir
        self._own_workdir: tempfile.TemporaryDirectory[str] | None = None
        self.workdir: Path | None = None
        self.startup_timeout = startup_timeout
        self.command_prefix = list(command_prefix)
        self._connect: Connect = connect or (lambda address, timeout: socket.create_connection(address, timeout))
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    # -- lifecycle --------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (the binary's own, through ``command_prefix``'s execs)."""
        return self._proc.pid if self._proc is not None else None

    def config(self) -> dict[str, Any]:
        """The generated configuration (a dict; written as JSON, which Prometheus reads as YAML)."""
        static: dict[str, Any] = {"targets": self.targets}
        if self.labels:
            static["labels"] = self.labels
        return {
            "global": {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                       "evaluation_interval": self.evaluation_interval},
            "rule_files": self.rule_files,
            "scrape_configs": [{"job_name": self.job, "static_configs": [static]}],
        }

    def start(self) -> PrometheusServer:
        if self._proc is not None:
            return self
        if self.binary is None:
            raise PrometheusError("no prometheus binary (install Debian's prometheus or set PROMETHEUS_BIN)")
        if self._workdir_arg is None:
            self._own_workdir = tempfile.TemporaryDirectory(prefix="fr-otel-prometheus-")
            self.workdir = Path(self._own_workdir.name)
        else:
            self.workdir = Path(self._workdir_arg)
            self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "prometheus.yml"
        atomic_write(config_path, json.dumps(self.config(), indent=2).encode())
        self.port = unused_tcp_port()
        cmd = [
            *self.command_prefix,
            self.binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
            *(f"--enable-feature={f}" for f in self.features),
        ]
        self._log = open(self.workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                if self._get("/-/ready", timeout=1)[0] == 200:
                    return self
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        self.stop()
        raise PrometheusError(f"prometheus not ready after {self.startup_timeout:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_workdir is not None:
            self._own_workdir.cleanup()
            self._own_workdir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, limit: int = 4000) -> str:
        if self.workdir is None or not (self.workdir / "prometheus.log").is_file():
            return "(no log)"
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-limit:] or "(empty log)"

    # -- HTTP API ---------------------------------------------------------------------
    def _get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """GET ``path`` over a connection from ``connect``: (status, body)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.sock = self._connect(("127.0.0.1", self.port), timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>``; returns ``data``; raises PrometheusError on an error status."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        status, raw = self._get(f"/api/v1/{path}" + (f"?{query}" if query else ""))
        try:
            body = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"{path}: HTTP {status}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query; a scalar result comes back as one sample without labels."""
        data = self.api("query", query=expr, time=at)
        if data["resultType"] == "vector":
            return [Sample(r["metric"], float(r["value"][1]), float(r["value"][0])) for r in data["result"]]
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]), float(data["result"][0]))]
        raise PrometheusError(f"unexpected result type {data['resultType']} for {expr!r}")

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]]

    def exemplars(self, expr: str, start: float, end: float) -> list[Exemplar]:
        """Stored exemplars of the series ``expr`` selects (needs exemplar storage)."""
        out = []
        for series in self.api("query_exemplars", query=expr, start=start, end=end):
            for e in series.get("exemplars", []):
                out.append(Exemplar(series["seriesLabels"], e["labels"], float(e["value"]), float(e["timestamp"])))
        return out

    def targets_health(self) -> list[dict[str, Any]]:
        """Active targets with ``health`` (up/down/unknown) and ``lastError``."""
        return list(self.api("targets", state="active")["activeTargets"])

    def wait_for_targets(self, up: int | None = None, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Until ``up`` targets (default: all) report ``up``; returns them, raises on timeout."""
        want = len(self.targets) if up is None else up
        deadline = time.monotonic() + timeout
        targets: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            targets = self.targets_health()
            if sum(t["health"] == "up" for t in targets) >= want:
                return targets
            time.sleep(0.2)
        raise PrometheusError(f"{want} targets not up after {timeout:g} s: {[(t['scrapeUrl'], t['health'], t.get('lastError')) for t in targets]}")

    def wait_for(self, expr: str, predicate: Callable[[list[Sample]], bool] = bool, timeout: float = 30.0,
                 interval: float = 0.25) -> list[Sample]:
        """Poll ``expr`` until ``predicate(result)`` (default: non-empty); returns the result.

        Raises :class:`TimeoutError` with the last result on timeout.
        """
        deadline = time.monotonic() + timeout
        result: list[Sample] = []
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{expr!r} not satisfied after {timeout:g} s; last result: {result}")
            time.sleep(interval)
