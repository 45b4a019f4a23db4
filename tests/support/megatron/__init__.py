"""A Megatron-style 3D-parallel job, simulated: real-format NCCL dumps with known ground truth.

Written from how such jobs behave, not from Megatron's code. The pieces, bottom up:

- ``layout``: ranks (tensor-parallel fastest, then data-parallel, then stage) and their groups;
- ``schedule``: what one rank issues per training step (interleaved 1F1B with batched send/recv,
  per-layer tensor-parallel all_reduces, ``get_batch`` broadcasts under a coalescing manager,
  the distributed optimizer's coalesced reduce_scatter/all_gather, embedding and grad-norm
  all_reduces, one ``.item()`` where the CPU waits for the GPU);
- ``engine``: the causal model (a CPU per rank running ahead of its GPU stream, collectives
  finishing once every member reached them) and the fault injectors;
- ``recorder``: each rank's Flight Recorder at the moment its dump is pulled (torch 2.13 layout,
  watchdog-late completions, ring wrap, only-active);
- ``scenarios`` / ``catalog``: named situations with their :class:`~.scenarios.Truth`.

    s = catalog.gpu_stall(13)          # rank 13's GPU hangs in a tensor-parallel all_reduce
    verdict = s.verdict()              # dumps made and read in memory, then analysed
    assert {c.rank: c.kind for c in verdict.culprits} == s.truth.culprits
    s.write(tmp_path / "dumps")        # or on disk, each file dated when it was pulled
"""
