"""When a rank with no readable dump was last seen at work is read from its peers' records: the collectives
they completed with it and the sends and receives they completed with it, as NCCL names them
(``nccl:send 0->1``: the backend's prefix, group-local ranks)."""

from __future__ import annotations

from pathlib import Path

from fr_otel import build_job, read_dumps
from fr_otel.diagnosis.cascade import last_seen_ns
from fr_otel.testing.dump_builder import DumpBuilder


def test_an_absent_ranks_last_send_and_receive_with_its_peers_count_as_seen(tmp_path: Path) -> None:
    """Rank 1 left no dump. Its last all_reduce with everyone is older than the transfers its pipeline
    neighbours completed with it afterwards: those are when it was last seen."""
    job = DumpBuilder(4)
    pp = job.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    for _ in range(3):
        job.collective(job.world)
        job.collective(pp)
    after_collectives = job.clock
    job.transfer(pp, 0, 1)
    job.transfer(pp, 1, 2)
    job.write(tmp_path)
    (absent,) = [p for p in tmp_path.iterdir() if p.name.endswith("_1") or p.name.endswith("1.pickle")]
    absent.unlink()
    read = read_dumps(tmp_path)
    assert sorted(read.dumps) == [0, 2, 3], read.problems
    seen = last_seen_ns(build_job(read), 1)
    assert seen is not None and seen > after_collectives


def test_a_rank_seen_only_in_collectives_is_seen_at_the_last_one_they_completed(tmp_path: Path) -> None:
    job = DumpBuilder(4)
    for _ in range(3):
        job.collective(job.world)
    last = job.clock
    job.collective(job.world, ranks=[0, 2, 3], done=False)  # rank 1 never came: not seen in it
    job.write(tmp_path)
    (absent,) = [p for p in tmp_path.iterdir() if p.name.endswith("_1") or p.name.endswith("1.pickle")]
    absent.unlink()
    seen = last_seen_ns(build_job(read_dumps(tmp_path)), 1)
    assert seen is not None and seen <= last
