"""ANPRED: anchor-based precision testing of deep learning libraries.

Heavy frameworks (torch, TensorFlow, OpenVINO) are imported lazily by the runners and exporters that
need them, never at package import.
"""

__version__ = "0.1.0"

from anpred.errors import AnpredError  # noqa: E402

__all__ = ["AnpredError", "__version__"]


def __getattr__(name):  # lazy public API: anpred.test(...)
    if name == "test":
        from anpred.pipeline import test

        return test
    raise AttributeError(f"module 'anpred' has no attribute {name!r}")
