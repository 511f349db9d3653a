"""Segment attention: the plan, the PyTorch paths, the compiled CPU op, the Triton kernel, cache layouts."""
