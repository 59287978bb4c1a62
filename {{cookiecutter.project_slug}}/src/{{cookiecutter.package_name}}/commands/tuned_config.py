"""configs/tuned.yaml: the options measured or searched on this machine, written one at a time."""

import platform
from datetime import date
from pathlib import Path

import yaml

from ..errors import PACKAGE
from ..training.checkpoint_io import write_whole

TUNED_CONFIG = Path("configs/tuned.yaml")


def update_tuned_config(key: str, value, how: str) -> None:
    """Set one option (a dotted name, as on the command line: model.lr) in configs/tuned.yaml,
    keeping the others and a comment line on how each was found."""
    text = TUNED_CONFIG.read_text() if TUNED_CONFIG.is_file() else ""
    tuned = yaml.safe_load(text) or {}
    replaced = f"# {key}:"
    notes = [line for line in text.splitlines()[1:] if line.startswith("# ") and not line.startswith(replaced)]
    *groups, name = key.split(".")
    section = tuned
    for group in groups:
        section = section.setdefault(group, {})
    section[name] = value
    notes.append(f"# {key}: {how}; on {platform.node()}, {date.today()}")
    header = f"# Measured on this machine. Use with: python -m {PACKAGE} fit --config {TUNED_CONFIG}"
    TUNED_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: it keeps what earlier measurements found.
    write_whole(TUNED_CONFIG, "\n".join([header, *notes]) + "\n" + yaml.safe_dump(tuned, sort_keys=True))
