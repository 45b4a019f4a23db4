"""A pod of deploy/kubernetes/training-job.example.yaml, started here as the kubelet would start it.

No kubelet runs here, so these do its part: each container's command and env as the manifest
gives them, ``fieldRef`` values supplied by the test (the node's address), ``$(VAR)`` expanded
from the variables listed before it, and each volume a folder that every container mounting
it shares (paths under a ``mountPath`` are moved there).
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any

import yaml

__all__ = ["EXAMPLE", "container", "kubelet_env", "pod_spec", "replace_once", "volumes"]

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "training-job.example.yaml"


def pod_spec(path: Path = EXAMPLE) -> dict[str, Any]:
    """The pod template's spec of the one Job in ``path``."""
    (job,) = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    return job["spec"]["template"]["spec"]


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """The container (or init container, where native sidecars live) called ``name``."""
    return next(c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == name)


def volumes(spec: dict[str, Any], of: dict[str, Any], tmp: Path) -> dict[str, Path]:
    """mountPath -> the folder standing in for that volume: one per volume, whichever container mounts it."""
    declared = {v["name"]: v for v in spec["volumes"]}
    out = {}
    for mount in of.get("volumeMounts", []):
        assert mount["name"] in declared, f"{of['name']} mounts an undeclared volume {mount['name']}"
        folder = tmp / "volumes" / mount["name"]
        folder.mkdir(parents=True, exist_ok=True)
        if "secret" in declared[mount["name"]] and not (folder / "secret").exists():  # the job's Secret, made per job
            (folder / "secret").write_text(secrets.token_hex(32))
        out[mount["mountPath"]] = folder
    return out


def kubelet_env(of: dict[str, Any], fields: dict[str, str], mounts: dict[str, Path]) -> dict[str, str]:
    """The container's env: fieldRefs from ``fields``, ``$(VAR)`` from the variables before it, then
    paths under a volume's mountPath moved to that volume's folder."""
    env: dict[str, str] = {}
    for item in of.get("env", []):
        if "valueFrom" in item:
            value = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
        env[item["name"]] = value
    return {name: _remount(value, mounts) for name, value in env.items()}


def _remount(value: str, mounts: dict[str, Path]) -> str:
    for mount_path, folder in mounts.items():
        root = mount_path.rstrip("/")
        if value == root or value.startswith(root + "/"):
            return str(folder) + value[len(root):]
    return value


def replace_once(words: list[str], old: str, new: str) -> list[str]:
    """``words`` with the one ``old`` in them replaced (a scaled-down copy of a manifest's command)."""
    assert words.count(old) == 1, (old, words)
    return [new if w == old else w for w in words]
