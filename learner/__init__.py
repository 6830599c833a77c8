"""Algorithms and their state: replay, DQN, rate limiter, evaluation, checkpoints."""
