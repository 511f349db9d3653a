"""The pure core, imported by every process: no vLLM import, nothing of vllm_hogwild outside ``core``.

One sub-package per subsystem, over shared base modules. Layers, highest first (``.importlinter``'s
"core's sub-packages" contract; a module imports only from its own layer's package or below):

- ``groups``: the group table and a group's life (kinds, admission, drafts, preemption);
- ``protocol``: the protocol driver, paragraphs, the collab protocol's answer and transcript;
- ``forkjoin``: fork/join families' rules and the lane records sent to the front end;
- ``views`` | ``replay``: what each worker reads (and RoPE) | the step log and replay;
- the base modules: ``options`` (engine and request options), ``protocol_text`` (the protocol's
  words), ``patterns`` (RE2 patterns), ``wire`` (engine core to worker processes), ``stats`` and
  ``stats_channel`` (metrics to the front end), ``errors``, ``log``, ``machine`` (the CPU a measurement ran
  on: benchmarks and training records).

Each package's ``__init__`` says what it owns and who calls it. The tasks, models, training and the
user's commands live in :mod:`vllm_hogwild.tasks`, :mod:`vllm_hogwild.models`, :mod:`vllm_hogwild.training` and
:mod:`vllm_hogwild.tools`.
"""
