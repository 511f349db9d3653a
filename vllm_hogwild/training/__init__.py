"""Training the collaborators (commands; CPU, seeded, reproducible on one machine):

- ``python -m vllm_hogwild.training.train``: the Roman-numerals and fork/join collaborators;
- ``python -m vllm_hogwild.training.train_links``: the links collaborator, in phases, the later ones on the
  engine's own runs, and (``--collaborator merges`` or ``checks``) the merges and checking collaborators;
  :mod:`.presence` is the loss that asks one of its heads to look at a written node, :mod:`.folders` reads a
  trained folder in and writes one out.

Each writes a plain Llama folder vLLM loads unchanged, with a ``training.json`` of its arguments, loss curve,
time, machine and commit. Reads :mod:`vllm_hogwild.models` and :mod:`vllm_hogwild.tasks`; nothing but the user's
commands (:mod:`vllm_hogwild.tools`) sits above it.
"""
