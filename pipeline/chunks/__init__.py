"""The chunk path: task arguments, the worker's actor and runtime, the transition stream, dispatch."""
