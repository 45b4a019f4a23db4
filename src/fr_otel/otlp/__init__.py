"""OTLP delivery: export configuration, protobuf encoding, chunked transport, the JSON Lines spool and replay.
"""
