"""Tools for users: the demo (the main job), the default model, benchmarks."""
