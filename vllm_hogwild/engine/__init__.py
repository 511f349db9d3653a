"""The vLLM glue in the engine core and the workers: scheduler, workers, attention backends, runner hook."""
