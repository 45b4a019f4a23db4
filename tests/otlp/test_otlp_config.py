"""ExportConfig resolution: explicit argument > OTEL_EXPORTER_OTLP_TRACES_* > OTEL_EXPORTER_OTLP_* > default."""

from __future__ import annotations

import pytest

from fr_otel.otlp import config as otlp_config
from fr_otel.otlp.config import (
    DEFAULT_GRPC_ENDPOINT,
    DEFAULT_HTTP_ENDPOINT,
    DEFAULT_MAX_REQUEST_BYTES,
    ENV_VARS,
    ExportConfig,
    parse_headers,
    resolve_export_config,
)


def test_nothing_configured_means_no_endpoint_and_spec_defaults() -> None:
    """With an empty environment the endpoint is None and every other field has its default."""
    config = resolve_export_config(environ={})
    assert config == ExportConfig()
    assert config.endpoint is None
    assert config.protocol == "grpc"
    assert config.timeout_s == 10.0
    assert config.compression == "none"
    assert config.insecure is None
    assert config.disabled is False
    assert config.max_request_bytes == DEFAULT_MAX_REQUEST_BYTES
    assert config.target() == DEFAULT_GRPC_ENDPOINT == "http://localhost:4317"


def test_default_target_follows_protocol() -> None:
    """An unconfigured HTTP exporter would dial localhost:4318/v1/traces."""
    config = resolve_export_config(protocol="http/protobuf", environ={})
    assert config.endpoint is None
    assert config.target() == DEFAULT_HTTP_ENDPOINT == "http://localhost:4318/v1/traces"


G = "OTEL_EXPORTER_OTLP_"
T = "OTEL_EXPORTER_OTLP_TRACES_"

PRECEDENCE = [
    # field, explicit argument, traces env, generic env, expected
    ("protocol", "http/protobuf", "grpc", "grpc", "http/protobuf"),
    ("protocol", None, "http/protobuf", "grpc", "http/protobuf"),
    ("protocol", None, None, "http/protobuf", "http/protobuf"),
    ("protocol", None, None, None, "grpc"),
    ("timeout_s", 2.5, "7", "9", 2.5),
    ("timeout_s", None, "7", "9", 7.0),
    ("timeout_s", None, None, "9", 9.0),
    ("timeout_s", None, None, None, 10.0),
    ("compression", "none", "gzip", "gzip", "none"),
    ("compression", None, "GZIP", "none", "gzip"),
    ("compression", None, None, "gzip", "gzip"),
    ("compression", None, None, None, "none"),
    ("insecure", False, "true", "true", False),
    ("insecure", None, "true", "false", True),
    ("insecure", None, None, "false", False),
    ("insecure", None, None, None, None),
    ("certificate_file", "/arg.pem", "/traces.pem", "/generic.pem", "/arg.pem"),
    ("certificate_file", None, "/traces.pem", "/generic.pem", "/traces.pem"),
    ("certificate_file", None, None, "/generic.pem", "/generic.pem"),
    ("certificate_file", None, None, None, None),
    ("headers", {"A": "arg"}, "a=traces", "a=generic", {"a": "arg"}),
    ("headers", None, "a=traces", "a=generic,b=2", {"a": "traces"}),
    ("headers", None, None, "a=generic,b=2", {"a": "generic", "b": "2"}),
    ("headers", None, None, None, {}),
]
ENV_SUFFIX = {
    "protocol": "PROTOCOL",
    "timeout_s": "TIMEOUT",
    "compression": "COMPRESSION",
    "insecure": "INSECURE",
    "certificate_file": "CERTIFICATE",
    "headers": "HEADERS",
}


@pytest.mark.parametrize(("field", "explicit", "traces", "generic", "expected"), PRECEDENCE)
def test_precedence(field: str, explicit: object, traces: str | None, generic: str | None, expected: object) -> None:
    """Each setting takes the explicit argument, else the TRACES_ variable, else the generic one, else the default."""
    env = {}
    if traces is not None:
        env[T + ENV_SUFFIX[field]] = traces
    if generic is not None:
        env[G + ENV_SUFFIX[field]] = generic
    kwargs = {field: explicit} if explicit is not None else {}
    config = resolve_export_config(environ=env, **kwargs)  # type: ignore[arg-type]
    assert getattr(config, field) == expected


ENDPOINTS = [
    # protocol, explicit, traces env, generic env, expected endpoint
    ("grpc", None, None, "http://collector:4317", "http://collector:4317"),
    ("grpc", None, "collector:5317", "http://collector:4317", "collector:5317"),
    ("grpc", "http://arg:1", "collector:5317", "http://collector:4317", "http://arg:1"),
    ("http/protobuf", None, None, "http://collector:4318", "http://collector:4318/v1/traces"),
    ("http/protobuf", None, None, "http://collector:4318/", "http://collector:4318/v1/traces"),
    ("http/protobuf", None, None, "https://gw/otlp", "https://gw/otlp/v1/traces"),
    ("http/protobuf", None, "http://collector:4318/custom", "http://x:4318", "http://collector:4318/custom"),
    ("http/protobuf", "http://arg:4318/p", "http://t:4318/q", "http://x:4318", "http://arg:4318/p"),
    ("http/json", None, None, "http://collector:4318", "http://collector:4318/v1/traces"),
    ("grpc", None, None, None, None),
]


@pytest.mark.parametrize(("protocol", "explicit", "traces", "generic", "expected"), ENDPOINTS)
def test_endpoint_resolution(
    protocol: str, explicit: str | None, traces: str | None, generic: str | None, expected: str | None
) -> None:
    """HTTP appends /v1/traces to the generic endpoint only; gRPC and specific endpoints are verbatim."""
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
    if traces is not None:
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = traces
    if generic is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = generic
    assert resolve_export_config(endpoint=explicit, environ=env).endpoint == expected


def test_protocol_env_is_mapped_by_us() -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL, which the SDK's exporter classes ignore, selects HTTP."""
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    config = resolve_export_config(environ=env)
    assert (config.protocol, config.endpoint) == ("http/protobuf", "http://c:4318/v1/traces")


def test_headers_are_url_decoded_and_keys_lower_cased() -> None:
    """Header values are URL-decoded, keys lower-cased, blanks around items ignored."""
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc%3D%3D , X-Tenant=team%2Cml,"}
    config = resolve_export_config(environ=env)
    assert config.headers == {"authorization": "Bearer abc==", "x-tenant": "team,ml"}


def test_parse_headers_keeps_equals_signs_in_values() -> None:
    """Only the first '=' separates key and value."""
    assert parse_headers("k=a=b") == {"k": "a=b"}


def test_sdk_disabled() -> None:
    """OTEL_SDK_DISABLED=true (any case) disables export; an argument overrides it."""
    assert resolve_export_config(environ={"OTEL_SDK_DISABLED": "TRUE"}).disabled is True
    assert resolve_export_config(environ={"OTEL_SDK_DISABLED": "false"}).disabled is False
    assert resolve_export_config(disabled=False, environ={"OTEL_SDK_DISABLED": "true"}).disabled is False


def test_empty_variables_count_as_unset() -> None:
    """A variable set to the empty string falls through to the next level."""
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
        "OTEL_EXPORTER_OTLP_ENDPOINT": " ",
    }
    config = resolve_export_config(environ=env)
    assert config.timeout_s == 3.0
    assert config.endpoint is None


def test_client_key_and_certificate_resolve_together() -> None:
    """Mutual TLS files come from the same precedence chain."""
    env = {
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k.pem",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": "/c.pem",
    }
    config = resolve_export_config(environ=env)
    assert (config.client_key_file, config.client_certificate_file) == ("/k.pem", "/c.pem")


BAD = [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "ten"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "-1"}, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "nan"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}, "OTEL_EXPORTER_OTLP_COMPRESSION"),
    ({"OTEL_EXPORTER_OTLP_INSECURE": "yes"}, "OTEL_EXPORTER_OTLP_INSECURE"),
    ({"OTEL_SDK_DISABLED": "maybe"}, "OTEL_SDK_DISABLED"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "OTEL_EXPORTER_OTLP_HEADERS"),
    ({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "=v"}, "OTEL_EXPORTER_OTLP_TRACES_HEADERS"),
    (
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ),
    (
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://c/v1"},
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k.pem"}, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
]


@pytest.mark.parametrize(("env", "variable"), BAD)
def test_bad_values_raise_one_line_naming_the_variable(env: dict[str, str], variable: str) -> None:
    """A malformed variable is a ValueError whose single-line message names it."""
    with pytest.raises(ValueError) as info:
        resolve_export_config(environ=env)
    message = str(info.value)
    assert variable in message
    assert "\n" not in message


def test_bad_explicit_argument_says_argument() -> None:
    """A bad explicit value is reported as such, not blamed on a variable."""
    with pytest.raises(ValueError, match="argument"):
        resolve_export_config(protocol="udp", environ={})
    with pytest.raises(ValueError, match="max_request_bytes"):
        resolve_export_config(max_request_bytes=10, environ={})


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``environ`` the process environment is used."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4317")
    assert resolve_export_config().endpoint == "collector:4317"


def test_env_var_constants_are_listed_and_named_after_themselves() -> None:
    """Every OTEL_* constant is in ENV_VARS and its value is its own name."""
    constants = {name: value for name, value in vars(otlp_config).items() if name.startswith("OTEL_")}
    assert all(name == value for name, value in constants.items())
    assert set(constants) == set(ENV_VARS)
    assert set(constants) <= set(otlp_config.__all__)


@pytest.mark.parametrize(("variable", "value", "field", "default", "said"), [
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "abc", "timeout_s", 10.0, "using the default (10 s)"),
    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "-3", "timeout_s", 10.0, "using the default (10 s)"),
    ("OTEL_EXPORTER_OTLP_INSECURE", "maybe", "insecure", None, "using the default (TLS unless"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd", "compression", "none", "using the default (none)"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuff", "protocol", "grpc", "using the default (grpc)"),
    ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "no-equals-sign", "headers", {}, "using the default (no headers)"),
    ("OTEL_SDK_DISABLED", "maybe", "disabled", False, "using the default (false)"),
])
def test_a_bad_inherited_value_is_a_warning_and_the_default_when_asked(
        variable: str, value: str, field: str, default: object, said: str) -> None:
    """With a warnings list, a bad protocol/headers/timeout/insecure/compression/disabled variable is
    one line there and its default is used, the endpoint kept; without one (or for an explicit
    argument) it still raises."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", variable: value}
    warnings: list[str] = []
    config = resolve_export_config(environ=env, warnings=warnings)
    assert getattr(config, field) == default and config.endpoint == "http://collector:4317"
    (line,) = warnings
    assert line.startswith(f"{variable}: ") and said in line and "\n" not in line
    with pytest.raises(ValueError, match=variable):
        resolve_export_config(environ=env)
    with pytest.raises(ValueError, match="argument"):
        resolve_export_config(environ={}, timeout_s=-1, warnings=[])


def test_the_agent_still_exports_with_a_bad_inherited_timeout(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The agent keeps the endpoint with OTEL_EXPORTER_OTLP_TIMEOUT=abc (default 10 s) and says so
    once; launched by `fr-otel run` (which already said it) it stays quiet."""
    from fr_otel.agent.lifecycle import export_config_for
    from fr_otel.agent.config import resolve_config

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "abc")
    monkeypatch.delenv("FR_OTEL_AUTOSTART", raising=False)
    config, _ = resolve_config({})
    with caplog.at_level("DEBUG", logger="fr_otel.agent"):
        resolved = export_config_for(config)
    assert resolved.endpoint == "http://collector:4317" and resolved.timeout_s == 10.0
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "OTEL_EXPORTER_OTLP_TIMEOUT" in warned[0].getMessage()
    caplog.clear()
    monkeypatch.setenv("FR_OTEL_AUTOSTART", "1")
    with caplog.at_level("DEBUG", logger="fr_otel.agent"):
        assert export_config_for(config).endpoint == "http://collector:4317"
    assert [r.levelname for r in caplog.records] == ["DEBUG"]


@pytest.mark.parametrize(("endpoint", "said"), [
    ("http://[::1", "Invalid IPv6 URL in endpoint 'http://[::1'"),
    ("http://user:s3cret@127.0.0.1:4317", "no user:password"),
    ("user:s3cret@127.0.0.1:4317", "no user:password"),
])
def test_bad_endpoints_name_the_source_and_never_echo_a_password(endpoint: str, said: str) -> None:
    """An unparsable endpoint names where it came from; credentials in one are refused and masked."""
    with pytest.raises(ValueError) as info:
        resolve_export_config(environ={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint})
    message = str(info.value)
    assert message.startswith("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: ") and said in message
    assert "s3cret" not in message and "\n" not in message
