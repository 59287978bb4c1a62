"""This machine's devices, and the refusal of trainer settings it cannot run before any model or
data is built.

Lightning would otherwise stop with a long traceback after building everything, or (16-mixed on a
CPU) run on in slow float16 emulation. The rules themselves are in rules.py.
"""

import platform
from importlib.util import find_spec

import torch
from lightning.pytorch.utilities import rank_zero_info

from ..data import usable_cpus
from ..errors import UserError
from .rules import Machine, fastest_precision, from_trainer, problems


class HardwareError(UserError, RuntimeError):
    """A strategy or precision this machine cannot run; the message names the fix."""


def machine_facts() -> dict:
    """Versions and devices, as plain data (doctor prints them)."""
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
                "bf16": props.major >= 8,
                "tf32": props.major >= 8,
            }
        )
    amx = _cpu_has_amx()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(),
        "nccl": _nccl_version() if gpus else None,
        "gpus": gpus,
        "mps": torch.backends.mps.is_available(),
        "cpu_bf16": amx or _cpu_computes_bf16(),
        "cpu_amx": amx,
        "cpus": usable_cpus(),
        "deepspeed": find_spec("deepspeed") is not None,
    }


def machine_of(facts: dict) -> Machine:
    """What the hardware rules need to know of a machine, from its facts."""
    return Machine(
        cuda_gpus=tuple(gpu["name"] for gpu in facts["gpus"]),
        bf16_on_gpus=all(gpu["bf16"] for gpu in facts["gpus"]),
        cuda_build=facts["cuda"] is not None,
        mps=facts["mps"],
        bf16_on_cpu=facts.get("cpu_bf16", True),
        amx_on_cpu=facts.get("cpu_amx", False),
        nccl=facts["nccl"] is not None,
        deepspeed=facts["deepspeed"],
    )


def check_hardware(trainer) -> None:
    """Raise HardwareError with the first reason this machine cannot train with these trainer settings."""
    found = problems(from_trainer(trainer), machine_of(machine_facts()))
    if found:
        raise HardwareError(f"{found[0]}.")


def settle_precision(trainer) -> None:
    """Run in 32-true where the configured bfloat16 would be slower, saying why (fit, or an evaluation)."""
    precision, why = fastest_precision(from_trainer(trainer), machine_of(machine_facts()))
    if why:
        rank_zero_info(f"Running in {precision}: {why}.")
        trainer["precision"] = precision


def _cpu_computes_bf16() -> bool:
    """Whether the CPU has bfloat16 arithmetic other than AMX's. oneDNN's own test (_is_mkldnn_bf16_supported)
    on an x86 CPU asks only for AVX-512, on which it emulates bfloat16, 3 to 4 times slower than float32."""
    try:
        if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
            return bool(torch.cpu._is_avx512_bf16_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # Arm: its BF16 extension
    except (AttributeError, RuntimeError):
        return False


def _cpu_has_amx() -> bool:
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):  # a torch without the check: none of its measurements here
        return False


def _nccl_version() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):  # CUDA builds without NCCL, such as Windows'
        return None


def _cudnn_version() -> str | None:
    if not torch.backends.cudnn.is_available():
        return None
    number = torch.backends.cudnn.version()  # 90100 for 9.1.0 (cuDNN 9), 8902 for 8.9.2 (cuDNN 8)
    major, rest = divmod(number, 10000) if number >= 90000 else divmod(number, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"
