"""Which hardware can train with which trainer settings: every rule once, with its one-line fix.

`problems` serves the CLI (which stops at the first), `doctor` (which lists them all), the smoke
test's fallback, and the template's generation check and tests. Standard library only: the
template's pre-generation hook loads this file by path, under a Python that usually has no torch.
"""

from __future__ import annotations  # the generation check may run under a Python older than the project's

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

# Strategies whose engines run on CUDA only. (FSDP2, configs/trainer/fsdp.yaml, also runs on CPU.)
CUDA_ONLY = {"FSDPStrategy": "FSDP (configs/trainer/fsdp1.yaml)", "DeepSpeedStrategy": "DeepSpeed"}
# Strategies that also run as processes on the CPU, over gloo: one per device asked for.
CPU_PROCESSES = {"DDPStrategy": "data parallel", "FSDP2Strategy": "FSDP2"}
# Strategies that start one process per device and talk over NCCL on GPUs.
MULTI_PROCESS = set(CUDA_ONLY) | set(CPU_PROCESSES)
# Lightning's registered strategy names, as they may be given on the command line.
REGISTERED = {"fsdp": "FSDPStrategy", "deepspeed": "DeepSpeedStrategy", "ddp": "DDPStrategy"}
# The strategy each answer to the template's `strategy` question trains with (its trainer preset).
ANSWERED_STRATEGIES = {"auto": "auto", "ddp": "DDPStrategy", "fsdp": "FSDP2Strategy", "deepspeed": "DeepSpeedStrategy"}


@dataclass(frozen=True)
class Settings:
    accelerator: str = "auto"
    devices: int | str | list[int] = "auto"  # a count, "auto", or device indices (a list or "0,1")
    strategy: str = "auto"  # a strategy class name (see strategy_class_name)
    precision: str = "32-true"
    num_nodes: int = 1

    @property
    def device_count(self) -> int | None:
        """Devices per node, or None for auto."""
        devices = self.devices
        if isinstance(devices, (list, tuple)):
            return len(devices)
        text = str(devices).strip()
        if text.startswith("[") or "," in text:
            return len([part for part in text.strip("[]").split(",") if part.strip()])
        return int(text) if re.fullmatch(r"-?[0-9]+", text) else None  # ASCII: isdigit() takes ² too


@dataclass(frozen=True)
class Machine:
    cuda_gpus: tuple[str, ...] = ()  # names of the visible CUDA GPUs
    bf16_on_gpus: bool = True  # every visible CUDA GPU computes in bfloat16 (compute capability 8.0+)
    bf16_on_cpu: bool = True  # the CPU computes in bfloat16 (AVX-512 BF16, AMX, Arm BF16) rather than emulating it
    amx_on_cpu: bool = False  # the CPU has Intel's AMX tiles
    cuda_build: bool = False  # torch was built with CUDA
    mps: bool = False  # Apple's Metal backend is available
    nccl: bool = True
    deepspeed: bool = True  # the deepspeed package is installed


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str  # in options and config files
    answers_fix: str = ""  # in the template's answers, for what holds on every machine

    def __str__(self) -> str:
        return f"{self.what}: {self.fix}"


def strategy_class_name(strategy) -> str:
    """The class name of a strategy as configured: a registered name, a class_path, or a mapping."""
    class_path = strategy.get("class_path") if hasattr(strategy, "get") else None  # a dict or a parsed Namespace
    if class_path:
        return str(class_path).rsplit(".", 1)[-1]
    name = str(strategy)
    for prefix, class_name in REGISTERED.items():
        if name == prefix or name.startswith(f"{prefix}_"):
            return class_name
    return name


def from_trainer(trainer) -> Settings:
    """The settings of a trainer config section: a dict from YAML, or LightningCLI's Namespace."""
    return Settings(
        accelerator=str(trainer.get("accelerator") or "auto"),
        devices=trainer.get("devices") if trainer.get("devices") is not None else "auto",
        strategy=strategy_class_name(trainer.get("strategy") or "auto"),
        precision=str(trainer.get("precision") or "32-true"),
        num_nodes=int(trainer.get("num_nodes") or 1),
    )


def from_answers(answers: Mapping[str, str]) -> Settings:
    """The settings of the template's answers: those of the trainer preset they pick."""
    devices, strategy = answers.get("devices", "1"), ANSWERED_STRATEGIES[answers["strategy"]]
    if strategy == "auto" and devices != "1" and answers["accelerator"] != "mps":
        strategy = "DDPStrategy"  # several devices: the ddp preset
    return Settings(accelerator=answers["accelerator"], devices=devices, strategy=strategy,
                    precision=answers["precision"])  # fmt: skip


def target(settings: Settings, machine: Machine | None) -> str | None:
    """Where the settings train: "cuda", "mps" or "cpu" (Lightning's order for auto and gpu), or None
    when it depends on a machine that is not known or has no such device."""
    accelerator = settings.accelerator
    if accelerator in ("cpu", "mps"):
        return accelerator
    if machine is None:
        return "cuda" if accelerator == "cuda" else None
    if machine.cuda_gpus:
        return "cuda" if accelerator in ("auto", "gpu", "cuda") else None
    if machine.mps and accelerator in ("auto", "gpu"):
        return "mps"
    return "cpu" if accelerator == "auto" else None


def problems(settings: Settings, machine: Machine | None = None) -> list[Problem]:
    """Every reason `settings` cannot train on `machine`, or with None on any machine, each with its
    fix; what holds on every machine comes first."""
    strategy, precision, devices = settings.strategy, settings.precision, settings.device_count
    found = []
    if strategy == "FSDP2Strategy" and precision.startswith("16"):
        found.append(Problem(
            f"FSDP2 (configs/trainer/fsdp.yaml) has no float16 loss scaling for precision {precision}",
            "use --trainer.precision bf16-mixed (Ampere or newer GPUs) or 32-true, or configs/trainer/ddp.yaml",
            "choose precision bf16-mixed or 32-true, or strategy ddp",
        ))  # fmt: skip
    where = target(settings, machine)
    if strategy in CUDA_ONLY and (where in ("cpu", "mps") or machine is not None and where != "cuda"):
        chosen = settings.accelerator in ("cpu", "mps")
        found.append(Problem(
            f"{CUDA_ONLY[strategy]} runs on NVIDIA GPUs only, and "
            + (f"accelerator is {settings.accelerator}" if chosen else "no CUDA GPU is visible"),
            "use --config configs/trainer/ddp.yaml or configs/trainer/fsdp.yaml (FSDP2, which also runs on CPU), "
            "or a machine with CUDA GPUs",
            "choose accelerator gpu or auto, or strategy auto or ddp",
        ))  # fmt: skip
    if where == "mps" and (strategy in MULTI_PROCESS or (devices or 1) > 1 or settings.num_nodes > 1):
        found.append(Problem(
            "Apple's MPS backend trains on one device in one process",
            "use --config configs/trainer/mps.yaml (devices 1, strategy auto)",
            "choose devices 1 and strategy auto",
        ))  # fmt: skip
    if where == "cpu" and strategy in CPU_PROCESSES and devices is None:
        found.append(Problem(
            f"{CPU_PROCESSES[strategy]} on the CPU with devices auto starts one process (Lightning counts the CPU "
            "as one device)",
            "give --trainer.devices the number of processes, such as 2",
            "answer devices with the number of processes, such as 2, or strategy auto",
        ))  # fmt: skip
    if precision.startswith("16") and where == "cpu":
        found.append(Problem(
            f"precision {precision} is float16 autocast for GPUs; on the CPU it is slow emulation",
            "use --trainer.precision bf16-mixed or 32-true",
            "choose precision bf16-mixed or 32-true",
        ))  # fmt: skip
    if machine is None:
        return found

    if settings.accelerator in ("gpu", "cuda") and where is None:
        fix = "check nvidia-smi and CUDA_VISIBLE_DEVICES" if machine.cuda_build else "install torch with CUDA"
        fix += ", or use --config configs/trainer/cpu.yaml"
        if strategy in CPU_PROCESSES:
            fix += " (or, to try this preset in two CPU processes, --trainer.accelerator cpu --trainer.devices 2"
            fix += " --trainer.precision 32-true)"
        found.append(Problem(f"accelerator {settings.accelerator}, but no CUDA GPU is visible", fix))
    elif settings.accelerator == "mps" and not machine.mps:
        found.append(Problem("accelerator mps, but Apple's MPS backend is not available",
                             "use --config configs/trainer/cpu.yaml"))  # fmt: skip
    if where == "cuda" and devices is not None and devices > len(machine.cuda_gpus):
        found.append(Problem(
            f"devices {devices}, but {len(machine.cuda_gpus)} CUDA GPU(s) are visible",
            f"use --trainer.devices {len(machine.cuda_gpus)} (or auto)",
        ))  # fmt: skip
    if where == "cuda" and precision.startswith("bf16") and not machine.bf16_on_gpus:
        # FSDP2 has no float16 loss scaling, so no 16-mixed.
        fallback = "32-true" if strategy == "FSDP2Strategy" else "16-mixed"
        found.append(Problem(
            f"precision {precision} needs NVIDIA GPUs of compute capability 8.0 or newer (Ampere), and this has "
            f"a {', '.join(sorted(set(machine.cuda_gpus)))}",
            f"use --trainer.precision {fallback}",
        ))  # fmt: skip
    if strategy == "DeepSpeedStrategy" and not machine.deepspeed:
        found.append(Problem("DeepSpeed is not installed", 'pip install -e ".[deepspeed]"'))
    if where == "cuda" and strategy in MULTI_PROCESS and not machine.nccl:
        found.append(Problem("multi-GPU training needs NCCL, which this torch lacks",
                             "install torch from pytorch.org"))  # fmt: skip
    return found


def fastest_precision(settings: Settings, machine: Machine) -> tuple[str, str]:
    """The precision to train with, and why it is not the configured one ("" when it is).

    bfloat16 on a CPU that emulates it (AVX2, or AVX-512 without its BF16 part) is several times slower
    than float32, and no more accurate. Where the CPU computes it, it depends on the CPU: resnet18's
    steps in bf16-mixed were 1.5x as fast as in float32 at 64 px (1.2x at 32 px) on an AMD EPYC with
    AVX-512 BF16, measured step by step in turn; on a Xeon with AMX, 0.59x and 0.82x at 32 px. So a
    run that lands on such a Xeon without asking for the CPU (accelerator auto) trains in float32;
    one put there on purpose (accelerator cpu) keeps its bf16-mixed.
    """
    if target(settings, machine) != "cpu" or not settings.precision.startswith("bf16"):
        return settings.precision, ""
    if not machine.bf16_on_cpu:
        return "32-true", f"this CPU lacks bfloat16 arithmetic: {settings.precision} would run emulated, far slower"
    if settings.precision == "bf16-mixed" and settings.accelerator != "cpu" and machine.amx_on_cpu:
        return "32-true", (
            "bfloat16 autocast was measured slower than float32 on a CPU with AMX (resnet18: 0.59x to 0.82x on a "
            "Xeon); --trainer.accelerator cpu keeps bf16-mixed"
        )
    return settings.precision, ""


def runnable(settings: Settings, machine: Machine) -> tuple[Settings, str]:
    """`settings`, or the nearest settings this machine can train with and why they differ ("" when
    they don't): fewer GPUs when too many were asked for, else one CPU process."""
    found = problems(settings, machine)
    if not found:
        precision, why = fastest_precision(settings, machine)
        return replace(settings, precision=precision), why
    if target(settings, machine) == "cuda":
        fewer = replace(settings, devices=str(len(machine.cuda_gpus)))
        if not problems(fewer, machine):
            return fewer, found[0].what
    # float16 autocast was asked for the GPUs: on the CPU it is slow emulation. bfloat16: as for a run that
    # lands on the CPU without asking for it (fastest_precision).
    cpu_precision = "32-true" if settings.precision.startswith("16") else settings.precision
    landed = Settings(accelerator="auto", devices="1", strategy="auto", precision=cpu_precision)
    precision = fastest_precision(landed, replace(machine, cuda_gpus=(), mps=False))[0]
    return Settings(accelerator="cpu", devices="1", strategy="auto", precision=precision), found[0].what
