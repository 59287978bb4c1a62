"""{{ cookiecutter.description | replace("\\", "\\\\") | replace('"', '\\"') }}"""

from .data import ImageDataModule
from .model import ImageClassifier

__all__ = ["ImageClassifier", "ImageDataModule"]
