"""Helpers only the tests use (configs, synthetic datasets, token ids); what benches share too
lives in the top-level `support` package."""
