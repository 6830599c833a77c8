"""Greedy evaluation as worker work: the request, and the worker side that steps the eval envs."""
