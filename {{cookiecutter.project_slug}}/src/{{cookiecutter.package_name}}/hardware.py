"""Strategy and precision choices this machine cannot run, refused before any model or data is built.

Lightning would otherwise stop with a long traceback after building everything, or (16-mixed on a
CPU) run on in slow float16 emulation.
"""

import torch

from .errors import UserError

# Strategies whose engines run on CUDA only. (FSDP2, configs/trainer/fsdp.yaml, also runs on CPU.)
CUDA_ONLY = {
    "FSDPStrategy": "FSDP (configs/trainer/fsdp1.yaml)",
    "DeepSpeedStrategy": "DeepSpeed",
}
# Lightning's registered strategy names, as they may be given on the command line.
REGISTERED = {"fsdp": "FSDPStrategy", "deepspeed": "DeepSpeedStrategy", "ddp": "DDPStrategy"}


class HardwareError(UserError, RuntimeError):
    """A strategy or precision this machine cannot run; the message names the fix."""


def strategy_class_name(strategy) -> str:
    """The class name of a strategy as configured: a registered name, a class_path, or a mapping."""
    class_path = strategy.get("class_path") if hasattr(strategy, "get") else None
    if class_path:
        return str(class_path).rsplit(".", 1)[-1]
    name = str(strategy)
    for prefix, class_name in REGISTERED.items():
        if name == prefix or name.startswith(f"{prefix}_"):
            return class_name
    return name


def check_hardware(trainer: dict) -> None:
    """Raise HardwareError when the trainer settings ask for what this machine lacks."""
    accelerator = str(trainer.get("accelerator", "auto"))
    precision = str(trainer.get("precision", "32-true"))
    on_cuda = accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not on_cuda and not torch.backends.mps.is_available())

    strategy = strategy_class_name(trainer.get("strategy", "auto"))
    if strategy == "FSDP2Strategy" and precision.startswith("16"):
        raise HardwareError(
            f"FSDP2 (configs/trainer/fsdp.yaml) has no float16 loss scaling for precision {precision}: use "
            "--trainer.precision bf16-mixed (Ampere or newer GPUs) or 32-true, or configs/trainer/ddp.yaml."
        )
    engine = CUDA_ONLY.get(strategy)
    if engine and not on_cuda:
        where = "no CUDA GPU is visible" if accelerator in ("gpu", "cuda", "auto") else f"accelerator is {accelerator}"
        raise HardwareError(
            f"{engine} runs on NVIDIA GPUs only, and {where}. Use --config configs/trainer/ddp.yaml or "
            "configs/trainer/fsdp.yaml (FSDP2, which also runs on CPU), or run on a machine with CUDA GPUs."
        )
    if precision.startswith("bf16") and on_cuda and not torch.cuda.is_bf16_supported(including_emulation=False):
        gpu = torch.cuda.get_device_name()
        # FSDP2 (ModelParallelStrategy) has no float16 loss scaling, so no 16-mixed.
        fallback = "32-true" if strategy == "FSDP2Strategy" else "16-mixed"
        raise HardwareError(
            f"precision {precision} needs an NVIDIA GPU of compute capability 8.0 or newer (Ampere), and this "
            f"is a {gpu}: use --trainer.precision {fallback}."
        )
    if precision.startswith("16") and on_cpu:
        raise HardwareError(
            f"precision {precision} is float16 autocast for GPUs; on the CPU it is slow emulation. "
            "Use --trainer.precision bf16-mixed or 32-true."
        )
