"""configs/tuned.yaml: what `tune` and `benchmark` measured on this machine, one option at a time."""

import platform
from datetime import date
from pathlib import Path

import yaml

TUNED_CONFIG = Path("configs/tuned.yaml")


def update_tuned_config(section: str, key: str, value, how: str) -> None:
    """Set one option in configs/tuned.yaml, keeping the others and a comment line on how each was found."""
    text = TUNED_CONFIG.read_text() if TUNED_CONFIG.is_file() else ""
    tuned = yaml.safe_load(text) or {}
    replaced = f"# {section}.{key}:"
    notes = [line for line in text.splitlines()[1:] if line.startswith("# ") and not line.startswith(replaced)]
    tuned.setdefault(section, {})[key] = value
    notes.append(f"# {section}.{key}: {how}; on {platform.node()}, {date.today()}")
    header = f"# Measured on this machine. Use with: python -m {{ cookiecutter.package_name }} fit --config {TUNED_CONFIG}"
    TUNED_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    TUNED_CONFIG.write_text("\n".join([header, *notes]) + "\n" + yaml.safe_dump(tuned, sort_keys=True))
