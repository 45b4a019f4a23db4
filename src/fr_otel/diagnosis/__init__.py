"""Diagnosis layer: the job model built from all ranks, and the cross-rank verdict.

``job`` lines the ranks up per process group; ``analysis`` runs the checks (``waits`` and ``p2p`` for
who waits on whom, ``mismatch`` for desyncs, ``straggler`` for slow ranks, ``stop_order`` for who
stopped first, ``step_map`` for the training step) and states the result as a ``verdict``.
"""
