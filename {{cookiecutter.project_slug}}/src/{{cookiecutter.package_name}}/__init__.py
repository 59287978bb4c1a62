"""{{ cookiecutter.description | replace("\\", "\\\\") | replace('"', '\\"') }}"""

import sys

try:
    from .data import ImageDataModule
    from .model import ImageClassifier
    from .training.quiet import one_line_warnings
except ModuleNotFoundError as missing:
    # `python -m` (argv[0] is "-m" while the package is imported) with a Python other than the environment's,
    # as a terminal where it is not activated gives: one line, not a traceback. An import in code raises.
    if sys.argv[:1] != ["-m"] or (missing.name or "").partition(".")[0] == __name__:
        raise
    sys.exit(
        f"error: {sys.executable} has no module {missing.name}, which this project needs: run it with its "
        "environment's Python (.venv/bin/python, which `make install` makes), or install the project into this one."
    )

one_line_warnings()

__all__ = ["ImageClassifier", "ImageDataModule"]
