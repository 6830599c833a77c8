"""Replay and its rate limiter: what an off-policy agent samples from, and how fast."""
