"""FSDP's unit of sharding: the repeated blocks of each family of torchvision backbones."""

import pytest
import torchvision
from torch import nn

from {{ cookiecutter.package_name }}.sharding import backbone_blocks, wrap_blocks


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
