"""The pure core: options, patterns, views, steps, RoPE, the protocol, admission, the planner. No vLLM import."""
