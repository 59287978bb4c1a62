"""`python -m {{ cookiecutter.package_name }} doctor`: is this machine ready to train this project?

One line per check: a verdict, what was found and, where it fails, the fix. `--json` prints the
same as data (the post-generation smoke test reads it).
"""

import argparse
import inspect
import json
import os
import platform
import shutil
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path

import torch
import yaml

from .cli import DEFAULT_CONFIGS
from .data import ImageDataModule, auto_workers, usable_cpus
from .hardware import CUDA_ONLY, strategy_class_name
{%- if cookiecutter.logger == "wandb" %}
from .wandb_logging import has_api_key
{%- endif %}


@dataclass
class Check:
    verdict: str  # "ok", "warn", "fail" or "info"
    what: str
    fix: str = ""


def machine() -> dict:
    """Versions and devices, as plain data."""
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
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(),
        "nccl": _nccl_version() if gpus else None,
        "gpus": gpus,
        "mps": torch.backends.mps.is_available(),
        "cpus": usable_cpus(),
    }


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


def data_defaults() -> dict:
    """The data module's defaults, from its signature, where LightningCLI reads them too."""
    parameters = inspect.signature(ImageDataModule.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not p.empty}


def read_config(paths: list[Path]) -> dict:
    """The trainer and data sections of the config files, later files winning key by key, the data
    section over the data module's defaults."""
    config: dict = {"trainer": {}, "data": data_defaults()}
    for path in paths:
        loaded = yaml.safe_load(path.read_text()) or {}
        for section in config:
            config[section].update(loaded.get(section) or {})
    return config


def checks(facts: dict, config: dict) -> list[Check]:
    trainer, data = config["trainer"], config["data"]
    accelerator = str(trainer.get("accelerator", "auto"))
    precision = str(trainer.get("precision", "32-true"))
    strategy = strategy_class_name(trainer.get("strategy", "auto"))
    devices = trainer.get("devices", "auto")
    gpus = facts["gpus"]
    found: list[Check] = [
        Check("info", f"Python {facts['python']}, torch {facts['torch']}"),
        Check("info", cuda_line(facts)),
    ]
    for index, gpu in enumerate(gpus):
        found.append(
            Check(
                "info",
                f"GPU {index}: {gpu['name']}, compute capability {gpu['capability']}, {gpu['memory_gib']} GiB, "
                f"bf16 {'yes' if gpu['bf16'] else 'no'}, TF32 {'yes' if gpu['tf32'] else 'no'}",
            )
        )

    if accelerator == "gpu" and not gpus:
        fix = (
            "install a CUDA build of torch (see pytorch.org)"
            if not facts["cuda"]
            else "check nvidia-smi and CUDA_VISIBLE_DEVICES"
        )
        found.append(Check("fail", "accelerator gpu, but no CUDA device is visible", fix))
    elif accelerator == "mps" and not facts["mps"]:
        found.append(Check("fail", "accelerator mps, but Apple's MPS backend is not available", "use accelerator cpu"))
    else:
        found.append(Check("ok", f"accelerator {accelerator}: {describe_target(accelerator, facts)}"))

    if accelerator in ("gpu", "auto") and gpus and str(devices).isdigit() and int(devices) > len(gpus):
        found.append(
            Check("fail", f"devices {devices}, but {len(gpus)} GPU(s) are visible", f"set devices to {len(gpus)}")
        )

    on_gpu = bool(gpus) and accelerator in ("gpu", "auto")
    if precision.startswith("bf16") and on_gpu and not all(gpu["bf16"] for gpu in gpus):
        found.append(Check("fail", f"precision {precision}, but a GPU lacks bf16", "use precision 16-mixed"))
    elif precision.startswith("16") and not on_gpu:
        found.append(Check("fail", f"precision {precision} needs a CUDA GPU", "use bf16-mixed or 32-true on CPU"))
    else:
        found.append(Check("ok", f"precision {precision}"))

    if strategy in CUDA_ONLY and not on_gpu:
        fix = "use configs/trainer/ddp.yaml or fsdp.yaml"
        found.append(Check("fail", f"{CUDA_ONLY[strategy]} needs CUDA GPUs", fix))
    if strategy == "DeepSpeedStrategy":
        if find_spec("deepspeed") is None:
            found.append(Check("fail", "DeepSpeed is not installed", 'pip install -e ".[deepspeed]"'))
        else:
            found.append(Check("ok", "DeepSpeed is installed"))
    if strategy in ("DDPStrategy", "FSDPStrategy", "FSDP2Strategy", "DeepSpeedStrategy") and on_gpu:
        nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
        found.append(
            Check("ok", "NCCL is available for multi-GPU")
            if nccl
            else Check("fail", "multi-GPU training needs NCCL, which this torch lacks", "get torch from pytorch.org")
        )

    found += data_checks(facts, data, devices if str(devices).isdigit() else max(1, len(gpus)))
{%- if cookiecutter.logger == "wandb" %}
    found.append(wandb_check())
{%- endif %}
    return found


def cuda_line(facts: dict) -> str:
    if not facts["cuda"]:
        return "torch is a CPU-only build"
    line = f"CUDA {facts['cuda']}, cuDNN {facts['cudnn']}"
    return line + (f", NCCL {facts['nccl']}" if facts["nccl"] else " (no CUDA device visible)")


def describe_target(accelerator: str, facts: dict) -> str:
    if facts["gpus"] and accelerator in ("gpu", "auto"):
        return f"{len(facts['gpus'])} CUDA GPU(s)"
    if facts["mps"] and accelerator in ("mps", "auto"):
        return "Apple MPS"
    return f"CPU ({facts['cpus']} cores)"


def data_checks(facts: dict, data: dict, devices: int) -> list[Check]:
    cpus = facts["cpus"]
    workers = data["num_workers"]
    workers = auto_workers(cpus, devices) if workers == "auto" else int(workers)
    found = []
    if workers * devices > cpus:
        found.append(
            Check(
                "warn",
                f"{workers} workers x {devices} devices exceed the {cpus} CPUs",
                f"set data.num_workers to {auto_workers(cpus, devices)} or auto",
            )
        )
    else:
        found.append(Check("ok", f"{workers} data workers per device, {cpus} CPUs"))

    shm = shutil.disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else None
    if shm is not None and workers > 0:
        # Workers hand batches over in shared memory: prefetched float batches of every device.
        side = int(data["image_size"])
        batch = int(data["batch_size"]) * 3 * side * side * 4
        needed = batch * workers * int(data["prefetch_factor"]) * devices
        if shm < 2 * needed:
            found.append(
                Check(
                    "warn",
                    f"/dev/shm is {shm / 2**30:.1f} GiB; the data workers may use {needed / 2**30:.1f} GiB",
                    "in Docker, run with --shm-size=16g or --ipc=host",
                )
            )
        else:
            found.append(Check("ok", f"/dev/shm {shm / 2**30:.1f} GiB"))
    return found
{%- if cookiecutter.logger == "wandb" %}


def wandb_check() -> Check:
    if os.environ.get("WANDB_MODE"):
        return Check("info", f"W&B mode {os.environ['WANDB_MODE']} (from WANDB_MODE)")
    if has_api_key():
        return Check("ok", "W&B API key found")
    return Check("warn", "no W&B API key: runs will log offline", "wandb login, or set WANDB_API_KEY")
{%- endif %}


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="{{ cookiecutter.package_name }} doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", type=Path, help="files to check (default: the CLI's)")
    parser.add_argument("--json", action="store_true", help="print the machine and the checks as JSON")
    options = parser.parse_args(args)
    paths = options.config or [path for path in DEFAULT_CONFIGS if path.is_file()]
    facts = machine()
    found = checks(facts, read_config(paths))
    if options.json:
        print(json.dumps({"machine": facts, "checks": [asdict(check) for check in found]}))
    else:
        for check in found:
            print(f"{check.verdict:>5}  {check.what}" + (f"  -> fix: {check.fix}" if check.fix else ""))
    return 1 if any(check.verdict == "fail" for check in found) else 0
