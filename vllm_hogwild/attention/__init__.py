"""Segment attention: the item plan and its lane table, the PyTorch path, the compiled CPU op and its plan, the Triton
kernels, cache layouts, which path runs."""
