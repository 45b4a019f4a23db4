"""The incident as OpenTelemetry spans: one timeline per rank, linked across ranks by collective.
"""
