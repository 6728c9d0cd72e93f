"""Installs jaxrl_post: `pip install -e .` (add `[test]` for the test suite)."""

import setuptools

_RUNTIME = [
    "jax>=0.6",
    "flax>=0.11",
    "optax",
    "orbax-checkpoint",
    "chex",
    "tensorflow-datasets",
    "array-record",
    "grain",
    "einops",
    "absl-py",
    "ml-collections",
    "numpy",
    "safetensors",
    "tokenizers",
    "tqdm",
    "filelock",  # the bounded persistent compilation cache (training.setup)
    "tensorboardX",
    "matplotlib",
    "jinja2",  # chat templates
    "pyarrow",  # parquet task files
    "huggingface_hub",  # init_from="hf:<repo id>", GSM8K / MATH files from the Hub
    "math-verify[antlr4_13_2]",  # MATH answers compared for mathematical equivalence
    "pebble",  # verifier worker pool whose per-sample time limit kills a stuck worker
    "etils[epath]",  # workdirs on gs:// and other non-local paths
]

_TEST = [
    "pytest",
    "pytest-xdist",
    "pytest-rerunfailures>=12",  # reruns a test whose xdist worker crashed (pyproject.toml)
    "scipy",
    # Pinned so that pip takes the CPU wheel; see README ("Installing torch").
    "torch==2.13.0",
    "transformers",
    # bench_train_step.py's reference engine (GRPOTrainer); with torch and transformers above
    # it adds only pure-Python wheels (trl, accelerate, datasets, dill, multiprocess, xxhash).
    "trl",
    "nbclient",
    "ipykernel",
    "ruff",
    "gymnax>=1.0.1",  # MLREF's inner PPO tests (jaxrl_post.rl_control)
    "brax>=0.14",  # MLREF's brax tasks (jaxrl_post.rl_control.brax_envs, imported lazily)
]

setuptools.setup(
    name="jaxrl_post",
    version="0.1.0",
    description="RL post-training of language models in JAX / Flax NNX.",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["jaxrl_post", "jaxrl_post.*"]),
    install_requires=_RUNTIME,
    extras_require={
        "test": _TEST,
        "gpu": ["jax[cuda12]"],
        "tpu": ["jax[tpu]"],
        "control": ["gymnax>=1.0.1", "brax>=0.14"],
        # gs:// workdirs (etils.epath over gcsfs) and the W&B metric writer.
        "pod": ["gcsfs", "wandb"],
    },
)
