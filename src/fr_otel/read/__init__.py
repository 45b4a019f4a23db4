"""Read layer: Flight Recorder dumps (and the files and payloads beside them) into per-rank models.

Untrusted input stops here: every field is validated once, pickles go through a restricted
unpickler, and no torch, gRPC or OpenTelemetry SDK is imported.
"""
