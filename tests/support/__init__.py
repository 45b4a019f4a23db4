"""Helpers the tests share: real jobs, real servers, hostile inputs (never shipped)."""
