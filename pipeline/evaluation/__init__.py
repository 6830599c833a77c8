"""Greedy evaluation as worker work: the request, the worker's runner, the learner's results."""
