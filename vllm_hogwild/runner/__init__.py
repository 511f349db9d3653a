"""vLLM's worker processes (the model runner): workers, attention backends, the runner hook, forced tokens."""
