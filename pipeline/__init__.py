"""Everything between workers and learner: codec, keys, weights, stream, dispatch, embedded stack, CLI."""
