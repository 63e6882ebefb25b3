"""Error types. Every user-facing error derives from :class:`AnpredError`; the CLI prints its message
on one line and exits with status 2 (bad input). Errors chain their cause (``raise ... from err``)."""


class AnpredError(Exception):
    """A user error (bad input, bad option, unreadable file). CLI exit status 2."""

    exit_code = 2


class ModelLoadError(AnpredError):
    """The file is not a readable ONNX model (not ONNX, truncated, missing external data)."""


class GraphError(AnpredError):
    """The graph is structurally unusable (no inputs, a cycle, an unknown tensor name)."""


class OutputPathError(AnpredError):
    """The output path cannot be written (unwritable folder, would overwrite another run)."""


class BackendError(AnpredError):
    """A backend name is unknown or a backend cannot be prepared for a model."""


class InputError(AnpredError):
    """Inputs are missing, unreadable, or do not fit the model's inputs."""


class JudgeError(AnpredError):
    """A run folder cannot be judged (fewer than two usable backends, mismatched manifests)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM received by the driver during :func:`anpred.run.run_model` (raised by its handler so that
    the worker process groups are killed and the partial run folder removed, as for Ctrl-C). Not an
    AnpredError: the CLI exits 143 (128 + SIGTERM), as for a signal."""
