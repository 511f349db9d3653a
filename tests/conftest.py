import os

# Tests inspect the engine core's scheduler: run it in this process (the model
# worker still runs in its own process). Small KV cache: several engines may
# live in one test process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
