"""vLLM's worker processes (the model runner): workers, the worker core and one adapter per model runner, attention
backends, forced tokens."""
