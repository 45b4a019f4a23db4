"""The Kubernetes example's watch sidecar: the dumps NCCL's watchdog leaves on the pod's shared volume
are exported, as one trace to the node's collector, after the ranks are gone (no torch needed)."""

from __future__ import annotations

import random
import shutil
import signal
from pathlib import Path

from support.jobs import Job, installed_bin, job_env
from support.kubernetes import container, kubelet_env, pod_spec, volumes

from fr_otel.testing.otlp import OtlpGrpcReceiver, wait_for
from fr_otel.common.ids import trace_id_for

#: 16 ranks' real NCCL watchdog dumps (vendored, see its README).
WATCHDOG_DUMPS = Path(__file__).resolve().parents[1] / "data" / "nvrx-fr-traces" / "gpu_error_1st"


def test_the_kubernetes_example_watch_sidecar_exports_the_watchdog_dumps_left_on_the_shared_volume(
        tmp_path: Path, jobs: list[Job]) -> None:
    """The example's fr-otel-watch container (its command and env, the node's collector at $(NODE_IP):4317)
    sees the dumps NCCL's watchdog writes at the trainer's TORCH_FR_DUMP_TEMP_FILE on the shared volume and
    exports one trace under the job id the agents use; the kubelet's SIGTERM then ends it with 0."""
    spec = pod_spec()
    trainer, watcher = container(spec, "trainer"), container(spec, "fr-otel-watch")
    node_ip = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    fields = {"status.hostIP": node_ip, "spec.nodeName": "k8s-node-3"}
    dump_prefix = kubelet_env(trainer, fields, volumes(spec, trainer, tmp_path))["TORCH_FR_DUMP_TEMP_FILE"]
    env = job_env(tmp_path, **kubelet_env(watcher, fields, volumes(spec, watcher, tmp_path)))
    env["PATH"] = f"{installed_bin(tmp_path / 'bin')}:{env['PATH']}"
    cmd = list(watcher["command"])
    world = cmd.index("--world-size") + 1
    assert f"--nproc-per-node={cmd[world]}" in trainer["command"], "one pod: the world is its ranks"
    dumps = sorted(WATCHDOG_DUMPS.glob("_dump_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    cmd[world] = str(len(dumps))
    with OtlpGrpcReceiver(address=f"{node_ip}:4317") as rx:
        jobs.append(job := Job(cmd, env, tmp_path, "watch"))
        for dump in dumps:  # the trainer's watchdog, then the abort
            shutil.copyfile(dump, dump_prefix + dump.name.rsplit("_", 1)[1])
        assert wait_for(lambda: any(s.span.name == "fr_otel.incident" for s in rx.spans())
                        or job.proc.poll() is not None, timeout=90, interval=0.2), job.output[-4000:]
        job.proc.send_signal(signal.SIGTERM)
        assert job.wait(30) == 0, job.output[-4000:]
    assert rx.trace_ids() == {f"{trace_id_for('llm-pretrain', 'watch-1'):032x}"}
    assert {s.resource_attributes.get("service.name") for s in rx.spans()} == {"llm-pretrain"}
