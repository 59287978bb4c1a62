"""{{ cookiecutter.description | replace("\\", "\\\\") | replace('"', '\\"') }}"""

from .data import ImageDataModule
from .model import ImageClassifier
from .training.quiet import one_line_warnings

one_line_warnings()

__all__ = ["ImageClassifier", "ImageDataModule"]
