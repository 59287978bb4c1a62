"""`python -m {{ cookiecutter.package_name }} consolidate FOLDER OUTPUT`: one checkpoint file from a sharded one.

FSDP, FSDP2 and DeepSpeed write a checkpoint as a folder of per-process shards. The single file this
makes loads in one process, without a GPU or the training strategy:
`ImageClassifier.load_from_checkpoint(OUTPUT)`. Lightning's and DeepSpeed's own converters do the work.
"""

from pathlib import Path

import torch

# Private, but the code Lightning's own `python -m lightning.pytorch.utilities.consolidate_checkpoint`
# runs; no public function returns a sharded checkpoint as a dict, which FSDP2's needs renaming in.
# pyproject.toml bounds lightning to the versions the tests ran this on.
from lightning.fabric.utilities.load import _load_distributed_checkpoint
from lightning.pytorch.utilities.consolidate_checkpoint import _format_checkpoint
from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

from ..errors import PACKAGE, CommandParser, DataError, MissingError, check_output_file, one_line
from ..training.checkpoint_io import written_whole


def consolidate(folder: Path, output: Path) -> None:
    if (folder / ".metadata").is_file():  # torch.distributed.checkpoint, as FSDP and FSDP2 write it
        checkpoint = _load_distributed_checkpoint(folder)
        if "model" not in checkpoint:  # FSDP2 stores the weights as "state_dict", FSDP1 as "model"
            checkpoint["model"] = checkpoint.pop("state_dict")
        with written_whole(output, "wb") as file:  # a half-written .ckpt would fail where it is loaded
            torch.save(_format_checkpoint(checkpoint), file)
    elif (folder / "latest").is_file():  # DeepSpeed names its newest tag in `latest`
        convert_zero_checkpoint_to_fp32_state_dict(folder, output)
    else:
        raise DataError(
            f"{folder} is not a sharded checkpoint folder (no .metadata file from FSDP/FSDP2, no `latest` "
            "file from DeepSpeed); a single-file checkpoint needs no consolidation."
        )


def main(args: list[str]) -> int:
    parser = CommandParser(prog=f"{PACKAGE} consolidate", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint folder, such as .../checkpoints/last.ckpt")
    parser.add_argument("output", type=Path, help="the single checkpoint file to write")
    options = parser.parse_args(args)
    if not options.checkpoint.exists():
        raise MissingError(f"{options.checkpoint}: no such folder. Give a sharded checkpoint's folder (.../last.ckpt).")
    if not options.checkpoint.is_dir():
        raise DataError(f"{options.checkpoint} is not a folder: only sharded checkpoints (folders) need consolidating.")
    check_output_file(options.output, "OUTPUT", "checkpoint file")
    options.output.parent.mkdir(parents=True, exist_ok=True)
    try:
        consolidate(options.checkpoint, options.output)
    except ValueError as error:  # the converters' word for shards they cannot read
        raise DataError(f"{options.checkpoint}: {one_line(error)}") from error
    print(f"Wrote {options.output}: load it with ImageClassifier.load_from_checkpoint({str(options.output)!r})")
    return 0
