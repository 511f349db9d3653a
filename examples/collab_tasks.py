"""A list of independent small tasks split among collaborating workers, through the OpenAI server.

    vllm serve MODEL --plugin hogwild            # in another terminal
    .venv/bin/python examples/collab_tasks.py --base-url http://localhost:8000/v1 [--workers 3]

One chat request with ``n`` workers and ``vllm_xargs={"hogwild_protocol":
"collab", "hogwild_task": "general"}``: the workers are told they are a team
and see each other's steps, so each can take tasks nobody has taken. Streams
every worker's text as it comes (choice i is worker i); the last event of the
stream carries the group's final answer in the ``hogwild`` field, which the
stock ``openai`` client exposes through ``model_extra``.
"""

from __future__ import annotations

import argparse

TASKS = [
    "Translate 'good morning' into French.",
    "Give the capital of Japan.",
    "Name a prime number between 20 and 30.",
    "Write the opposite of 'ancient'.",
    "Compute 12 times 11.",
    "Spell 'necessary' backwards.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://localhost:8000/v1")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160, help="per worker")
    args = parser.parse_args()

    import openai

    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    model = client.models.list().data[0].id
    task = ("Do every task in this list, splitting them between you; then one of you writes all the results "
            "on one line after 'Final answer:'.\n" + "\n".join(f"{i + 1}. {t}" for i, t in enumerate(TASKS)))
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": task}], n=args.workers, max_tokens=args.max_tokens,
        temperature=0.6, seed=3, stream=True,
        extra_body={"vllm_xargs": {"hogwild_protocol": "collab", "hogwild_task": "general"}})
    texts, result = [""] * args.workers, None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
        result = (chunk.model_extra or {}).get("hogwild", result)
    for i, text in enumerate(texts):
        print(f"--- worker {i} ---\n{text.strip()}\n")
    if result and result["answer"] is not None:
        print(f"final answer (from {result['name']}, {result['source']}): {result['answer']}")
    else:
        print("final answer: none")


if __name__ == "__main__":
    main()
