"""The user's surface: the `clusterenv` command line, presets, reports, checkpoint evaluation."""
