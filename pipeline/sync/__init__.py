"""Weight sync: the learner's weight source, the workers' weight client, sync rules and divergences."""
