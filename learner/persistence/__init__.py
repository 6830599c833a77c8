"""What outlives the learner process: checkpoints, the best network, resuming a run directory."""
