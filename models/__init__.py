"""ANPRED's model zoo: ``models.get(name)`` and ``models.REGISTRY`` (see :mod:`models.zoo`).

Importing this package is cheap: torch, TensorFlow and ultralytics are imported only when a model is
built.
"""

from models.registry import REGISTRY, ZooEntry, ZooInput, names
from models.zoo import ZooModel, get

__all__ = ["REGISTRY", "ZooEntry", "ZooInput", "ZooModel", "get", "names"]
