"""SAC: twin Q critics, a tanh-squashed Gaussian actor the workers sample, entropy tuned."""
