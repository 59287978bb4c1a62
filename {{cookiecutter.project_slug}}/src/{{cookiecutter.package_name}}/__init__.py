"""{{ cookiecutter.description }}"""

from .data import ImageDataModule
from .model import ImageClassifier

__all__ = ["ImageClassifier", "ImageDataModule"]
