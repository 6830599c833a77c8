"""Learner tests share one process with the rest of the suite: a run wired here (Run.create)
configures torch as the learner process does (subnormals flushed to zero, one thread), and that
state is the thread's, so it is put back after each test (hypothesis, for one, refuses to draw
floats in a thread that flushes subnormals)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def torch_as_it_was():
    threads = torch.get_num_threads()
    yield
    torch.set_flush_denormal(False)
    torch.set_num_threads(threads)
