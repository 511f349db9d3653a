"""The pure core: options, patterns, views, paragraphs, the group table and its step log, RoPE, the protocol,
admission, the planner. No vLLM import."""
