"""FSDP's unit of sharding (the repeated blocks of each family of torchvision backbones), and
DeepSpeed's mixed precision on a model with BatchNorm, and which of their saves are staged."""

import os
import subprocess
import sys
import textwrap

import pytest
import torchvision
from torch import nn

from {{ cookiecutter.package_name }}.hardware.sharding import backbone_blocks, wrap_blocks


@pytest.mark.parametrize(
    ("backbone", "blocks"),
    [("resnet18", 8), ("resnet50", 16), ("mobilenet_v3_small", 11), ("efficientnet_b0", 16), ("convnext_tiny", 18),
     ("vit_b_16", 12), ("swin_t", 12), ("densenet121", 58), ("regnet_y_400mf", 16), ("vgg11", 0)],
)  # fmt: skip
def test_each_block_is_found_once(backbone, blocks):
    model = torchvision.models.get_model(backbone, weights=None, num_classes=6)
    found = backbone_blocks(model)
    assert len(found) == len({id(block) for block in found}) == blocks
    # Inner blocks come before the blocks that hold them, so fully_shard takes the innermost first.
    for later, block in enumerate(found):
        assert not any(inner in found[later:] for inner in block.modules() if inner is not block)


def test_the_fsdp1_policy_wraps_blocks_and_walks_into_everything():
    model = torchvision.models.resnet18(num_classes=6)
    assert wrap_blocks(model.layer1[0], recurse=False, nonwrapped_numel=0)
    assert not wrap_blocks(model.conv1, recurse=False, nonwrapped_numel=0)
    assert wrap_blocks(nn.Linear(2, 2), recurse=True, nonwrapped_numel=0)


# One bf16 step of the model in DeepSpeed's engine, on the CPU (Lightning's DeepSpeedStrategy
# runs only on CUDA), with the config the strategy gives it once the model has been configured.
DEEPSPEED_STEP = textwrap.dedent(
    """
    import sys

    import deepspeed
    import lightning as L
    import torch
    import torch.distributed as dist
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from {{ cookiecutter.package_name }}.model import ImageClassifier

    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
    # Not the shared-memory all-reduce of CPU processes, which one process never uses and which
    # DeepSpeed compiles on first use (over a minute and a half on a busy 2-core CI machine).
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

    strategy = DeepSpeedStrategy(stage=2)
    trainer = L.Trainer(accelerator="cpu", strategy=strategy, precision="bf16-mixed", logger=False)
    model = ImageClassifier(backbone="resnet18", num_classes=3)
    model.trainer = trainer
    model.configure_model()
    strategy._init_config_if_needed()
    config = strategy.config | {"train_micro_batch_size_per_gpu": 2}
    engine, *_ = deepspeed.initialize(model=model, config=config, optimizer=torch.optim.AdamW(model.parameters()))
    loss = engine(torch.randn(2, 3, 32, 32, dtype=torch.bfloat16)).float().logsumexp(-1).mean()
    engine.backward(loss)
    engine.step()
    print("stepped")

    # Its saves go through a staging folder, renamed into place after they are written, unless its
    # checkpoint writer goes on writing after a save returns.
    from pathlib import Path

    from {{ cookiecutter.package_name }}.training.checkpoint_io import replace, stages_its_saves

    strategy.model = engine
    staged = stages_its_saves(strategy)
    folder = Path(sys.argv[1]).parent
    for _ in range(2):  # the second time, over the first
        engine.save_checkpoint(folder / ".last.ckpt.partial", tag="checkpoint")
        replace(folder / ".last.ckpt.partial", folder / "last.ckpt")
    loaded, _ = engine.load_checkpoint(folder / "last.ckpt")
    engine.checkpoint_engine.is_decoupled = lambda: True
    print("staged", staged, stages_its_saves(strategy), "loaded", loaded is not None)
    """
)


def test_deepspeed_trains_a_batchnorm_model_in_bf16(tmp_path):
    pytest.importorskip("deepspeed")
    env = os.environ | {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, "-c", DEEPSPEED_STEP, str(tmp_path / "store")], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "stepped" in done.stdout, done.stderr[-3000:]
    assert "staged True False loaded True" in done.stdout
