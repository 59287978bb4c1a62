"""Shape the rendered project to the answers: files of options not chosen are removed, not left empty."""

from pathlib import Path

LOGGER = {{ cookiecutter.logger | tojson }}
PACKAGE = Path("src") / {{ cookiecutter.package_name | tojson }}

UNSELECTED = {
    PACKAGE / "wandb_logging.py": LOGGER != "wandb",
    Path("tests") / "test_wandb_logging.py": LOGGER != "wandb",
}


def remove_unselected() -> None:
    for path, unselected in UNSELECTED.items():
        if unselected:
            path.unlink()


if __name__ == "__main__":
    remove_unselected()
