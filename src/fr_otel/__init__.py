"""fr-otel: make hangs in distributed PyTorch training obvious.

Reads PyTorch Flight Recorder dumps (never importing torch), builds a job model,
and names the culprit ranks with evidence.
"""
