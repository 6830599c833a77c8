"""The PPO agent: config, loss, learning step, builder."""
