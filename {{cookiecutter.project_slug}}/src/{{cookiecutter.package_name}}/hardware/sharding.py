"""Which parts of a backbone (torchvision's{{ " or timm's" if cookiecutter.timm == "yes" }}) FSDP shards as one unit: its repeated blocks.

A block is the unit of an all-gather: sharding per block keeps one block's full parameters in
memory at a time, with far fewer collectives than sharding per layer. Both FSDP presets use this
list: FSDP2 (configs/trainer/fsdp.yaml) in ImageClassifier.configure_model, FSDP1
(configs/trainer/fsdp1.yaml) as the auto-wrap policy.
"""

from datetime import timedelta
from unittest import mock

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy, Strategy
from torch import nn

# The repeated block classes of torchvision's classification models. A backbone with none of them
# (AlexNet, VGG) is sharded as one unit, which still shards its optimizer state and gradients.
BLOCK_CLASS_NAMES = frozenset(
    {
        "BasicBlock",  # ResNet 18/34
        "Bottleneck",  # ResNet 50+, ResNeXt, Wide ResNet
        "ResBottleneckBlock",  # RegNet
        "InvertedResidual",  # MobileNet V2/V3, ShuffleNet V2
        "_InvertedResidual",  # MNASNet
        "MBConv",  # EfficientNet, MaxViT
        "FusedMBConv",  # EfficientNet V2
        "CNBlock",  # ConvNeXt
        "EncoderBlock",  # ViT
        "SwinTransformerBlock",  # Swin
        "SwinTransformerBlockV2",  # Swin V2
        "PartitionAttentionLayer",  # MaxViT
        "_DenseLayer",  # DenseNet
        "Fire",  # SqueezeNet
        "Inception",  # GoogLeNet
        "InceptionA",  # Inception V3, and the four below
        "InceptionB",
        "InceptionC",
        "InceptionD",
        "InceptionE",
{%- if cookiecutter.timm == "yes" %}
        # timm's (BasicBlock, Bottleneck, InvertedResidual and SwinTransformerBlock are named as torchvision's)
        "ConvNeXtBlock",  # ConvNeXt V1, V2
        "Block",  # ViT, DeiT, BEiT
        "EvaBlock",  # EVA
        "DepthwiseSeparableConv",  # EfficientNet, MobileNet V3 (their first stage)
        "EdgeResidual",  # EfficientNet V2
        "ConvBnAct",  # EfficientNet's plain stages
        "SwinTransformerV2Block",
        "MbConvBlock",  # MaxViT, CoAtNet
        "PartitionAttentionCl",
{%- endif %}
    }
)


def shards_weights(strategy: Strategy) -> bool:
    """Whether `strategy` splits the parameters across processes rather than copying them whole."""
    return isinstance(strategy, (FSDPStrategy, ModelParallelStrategy, DeepSpeedStrategy))


def share_buffers(module: nn.Module) -> None:
    """Rank 0's buffers (BatchNorm statistics) on every process. Sharding engines leave each
    process its own, which drift apart; DDP does the same from rank 0 at every forward."""
    for buffer in module.buffers():
        torch.distributed.broadcast(buffer, src=0)


def cast_buffers_with_parameters(strategy: Strategy) -> None:
    """Under DeepSpeed in bf16 or fp16, cast BatchNorm's statistics with the weights.

    DeepSpeed 0.19 casts only the parameters, keeping buffers in float32 unless its config names a
    dtype, and BatchNorm then fails ("Expected running_mean to have type BFloat16"). Earlier releases
    cast both, as this asks, and ignore the setting.
    """
    if not isinstance(strategy, DeepSpeedStrategy):
        return
    half = {"bf16": "bf16", "16": "fp16"}.get(strategy.precision_plugin.precision.split("-")[0])
    if half:
        strategy.config.setdefault("data_types", {}).setdefault("buffer_dtype", half)


def is_block(module: nn.Module) -> bool:
    kind = type(module)
    return kind.__name__ in BLOCK_CLASS_NAMES and kind.__module__.startswith({{ '("torchvision.models", "timm.models")' if cookiecutter.timm == "yes" else '"torchvision.models"' }})


def backbone_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of `model`, innermost first, so each is sharded before the block that holds it."""
    return [module for module in reversed(list(model.modules())) if is_block(module)]


def wrap_blocks(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
    """FSDP1 auto-wrap (and activation-checkpointing) policy: one unit per block."""
    return recurse or is_block(module)


def fully_shard_blocks(model: nn.Module, mesh) -> None:
    """Shard `model` with FSDP2: each block, then the rest as the root unit.

    Mixed precision comes from the trainer's autocast (bf16-mixed), not from FSDP2's
    MixedPrecisionPolicy: gathering BatchNorm weights in bf16 beside float32 running statistics
    fails on CPU, and autocast keeps master weights, gradients and optimizer state in float32.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard  # torch 2.6+, needed here only

    if isinstance(model, FSDPModule):  # configure_model runs again for each stage of a process
        return
    for block in backbone_blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy as plain FSDP2: every process is one data-parallel replica.

    (ModelParallelStrategy's "auto" sizes make each node one replica and its devices a tensor-parallel
    group, which needs a model written for tensor parallelism.)

    Args:
        save_distributed_checkpoint: Each process writes its own shard into a checkpoint folder
            (fast, any model size); otherwise rank 0 gathers and writes a single file.
        process_group_backend: The torch.distributed backend; by default nccl on GPUs, gloo on CPUs.
        timeout: How long a collective waits for the other processes before failing.
    """

    def __init__(
        self,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        super().__init__(
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict:
        # A checkpoint file of a run on one device or under DDP holds channels-last weights and optimizer
        # moments. Lightning hands them to the shards through torch's broadcast from rank 0, which sends
        # a tensor's memory as it lies: the other processes got the elements in another order.
        load = torch.load

        def contiguous_load(*args, **kwargs):
            return apply_to_collection(load(*args, **kwargs), torch.Tensor, torch.Tensor.contiguous)

        with mock.patch.object(torch, "load", contiguous_load):
            return super().load_checkpoint(checkpoint_path, weights_only)

    def lightning_module_state_dict(self) -> dict:
        # Each process saves part of the replicated buffers: make them one model's, rank 0's.
        share_buffers(self.lightning_module)
        return super().lightning_module_state_dict()
