"""Commands for users: the demo (the main job), the default model, the trained collaborators (training, running them on a task)."""
