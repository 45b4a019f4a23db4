"""Helpers shipped to users for testing their own setups (real gloo hangs, real OTLP receivers)."""
