"""Verifier: builds a candidate, proves it correct on fresh inputs, times it honestly, rejects hacks."""
