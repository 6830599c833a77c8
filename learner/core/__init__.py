"""What every agent and the run share: the role interfaces, networks, the env's spaces."""
