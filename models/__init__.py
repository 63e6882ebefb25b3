"""ANPRED's model zoo: ``models.get(name)`` and ``models.REGISTRY`` (see :mod:`models.zoo`).

Importing this package is cheap: torch, TensorFlow and ultralytics are imported only when a model is
built.
"""

from models.zoo import REGISTRY, ZooEntry, ZooModel, get, names

__all__ = ["REGISTRY", "ZooEntry", "ZooModel", "get", "names"]
