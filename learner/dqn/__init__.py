"""The DQN agent: config, learning step, builder."""
