"""Where stateful regions keep their checkpoints: incremental, keyed, in Delta tables."""
