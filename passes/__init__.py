"""ONNX graph passes: small, each does one thing and reports whether it changed the graph."""

from passes.base import GraphPass, PassError, PassManager, PassResult

__all__ = ["GraphPass", "PassError", "PassManager", "PassResult"]
