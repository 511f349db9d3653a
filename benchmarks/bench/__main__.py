"""``python -m benchmarks.bench ...`` (from the checkout's root)."""

from .cli import main

main()
