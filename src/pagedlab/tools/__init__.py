"""Tools around the engine: the command line, the live demo, course assignments, the bundled model's training."""
