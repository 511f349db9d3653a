"""Development tools, beside the package and not installed with it: the vLLM source checker
(``python -m tools.upstream``) and the synthetic paged caches the kernel tests and benchmarks build."""
