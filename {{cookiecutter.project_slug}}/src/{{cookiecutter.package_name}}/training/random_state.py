"""The training process's random state, kept in each checkpoint and restored on resume, so that what
the model draws (dropout, stochastic depth, a user's own draws) goes on as in an uninterrupted run.

The data's draws do not come from here: each image and batch draws from a seed of its own
(datasets/sampling.py's seeded_draws). Under DDP, every process is seeded alike and draws alike,
so rank 0's state, which is the one saved, is each process's.
"""

import random

import numpy as np
import torch


def capture() -> dict:
    """torch's CPU and CUDA generators, NumPy's and Python's, as tensors, ints and tuples (which
    a checkpoint loads with weights_only=True)."""
    _, keys, position, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": position,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, numpy["position"], numpy["has_gauss"], numpy["gauss"]))
    random.setstate(state["python"])
    # The same number of GPUs, or the draws were split otherwise anyway.
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
