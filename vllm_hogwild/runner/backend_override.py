"""Install a Hogwild attention backend over a platform backend, in this worker process."""

from __future__ import annotations


def override_backend(backend, class_path: str) -> None:
    """Register ``class_path`` for ``backend`` and forget backends vLLM already resolved.

    vLLM caches its backend choice per process: an engine built earlier in this
    process (a stock one, with an in-process worker) would otherwise hand its
    cached class to this engine's attention layers.
    """
    from vllm.v1.attention.backends.registry import register_backend
    from vllm.v1.attention.selector import _cached_get_attn_backend

    register_backend(backend, class_path)
    _cached_get_attn_backend.cache_clear()
