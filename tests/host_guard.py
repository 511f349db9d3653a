"""A guard for code a CUDA graph captures: it may neither allocate nor wait for the device.

:class:`NoHostWork` is a ``TorchDispatchMode`` that fails on every torch op whose result is new memory (an
allocation: a factory op, an out-of-place op) and on every read of a tensor's value into Python
(``.item()``, ``bool()``, ``int()``, ``.tolist()``, ``.numpy()``: on a GPU each one synchronises with the
device), and on any copy to another device. Views, in-place ops and ``out=`` ops pass. What it cannot see:
work outside torch's dispatcher (a Triton launch; under Triton's interpreter the launch copies its
arguments through numpy, so the tests run launches with the guard off: see ``paused``).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten


class HostWork(AssertionError):
    """Code under the guard allocated or read a value into Python."""


def _storages(tree) -> set[int]:
    leaves, _ = tree_flatten(tree)
    return {t.untyped_storage().data_ptr() for t in leaves if isinstance(t, torch.Tensor)}


class NoHostWork(TorchDispatchMode):
    READS = ("tolist", "numpy", "cpu", "item")  # Tensor methods that read values into Python or to the host

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []  # every op seen (for the report)
        self._paused = 0
        self._saved: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        self.ops.append(str(func))
        if func is aten._local_scalar_dense.default:
            raise HostWork(f"{func}: a tensor's value read into Python (a host synchronisation on a GPU)")
        devices = {t.device for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        inputs = _storages((args, kwargs))
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                if devices and t.device not in devices:
                    raise HostWork(f"{func}: a copy to {t.device}")
                if t.untyped_storage().data_ptr() not in inputs and t.numel():
                    raise HostWork(f"{func}: new memory ({tuple(t.shape)} {t.dtype}): an allocation")
        return out

    def __enter__(self):
        for name in self.READS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def refuse(tensor, *a, _name=name, _original=original, **k):
                if self._paused:
                    return _original(tensor, *a, **k)
                raise HostWork(f"Tensor.{_name}(): a tensor's value read on the host")

            setattr(torch.Tensor, name, refuse)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()
        return super().__exit__(*exc)

    @contextlib.contextmanager
    def paused(self):
        """Code that is not under test (a kernel launch under Triton's interpreter)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
