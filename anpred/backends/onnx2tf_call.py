"""The onnx2tf conversion of the ``tf`` backend (:mod:`anpred.backends.tf_onnx`, steps 1 to 3 of its
docstring): the scratch copy onnx2tf converts, the call (``onnxsim`` on ``PATH``, its ``sys.exit`` and
exceptions turned into :class:`~anpred.errors.BackendError` with onnx2tf's own error lines), the
converted model's inputs and outputs as ``meta.json`` records them, and the SavedModel export.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path
from typing import Any

from anpred.backends.tf_prepare import prepare_for_onnx2tf
from anpred.errors import BackendError

__all__ = ["scratch_model", "run_onnx2tf", "converted_io", "export_saved_model", "fix_input_dims"]


def scratch_model(
    model_path: Path, scratch: Path, fixed: dict[str, list[int]] | None, decompose: list[str] | None
) -> tuple[Path, dict[str, Any]]:
    """Write the copy of ``model_path`` onnx2tf converts to ``scratch/model.onnx`` (weights inline, the
    dynamic input dims ``fixed``, ``Constant`` nodes as initializers, ``decompose``'s ops in elementary
    ones, :func:`~anpred.backends.tf_prepare.prepare_for_onnx2tf`) with the local calibration file beside
    it; returns ``(its path, what prepare_for_onnx2tf did)``."""
    import onnx

    from anpred.backends.convert import fold_constant_nodes, onnx2tf_calibration_file
    from anpred.onnx_io import load_model

    model = load_model(model_path, load_external=True)
    for t in model.graph.initializer:  # store weights inline in the scratch copy
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
    if fixed:
        fix_input_dims(model, fixed)
    # onnx2tf's binary-op validation does not take a Constant node's TF constant for a constant and
    # fails ("... Found: 3.0", PP-OCRv4 det at 256x256); initializers reach it as NumPy arrays
    fold_constant_nodes(model)
    if decompose:  # elementary ops instead (passes.frontend_rewrites)
        from passes.frontend_rewrites import decompose_ops

        decompose_ops(model, set(decompose))
    prep = prepare_for_onnx2tf(model)
    src = scratch / "model.onnx"
    onnx.save(model, str(src))
    onnx2tf_calibration_file(scratch)
    return src, prep


def run_onnx2tf(src: Path, o2t: dict[str, Any], log: io.StringIO, model_name: str, renamed: dict[str, str]):
    """``onnx2tf.convert`` of ``src`` (in its folder, the working directory; ``o2t``: the extra keyword
    arguments) with its output going to ``log``; returns the tf_keras model. ``model_name`` and
    ``renamed`` (node names :func:`~anpred.backends.tf_prepare.tf_safe_node_names` changed: new ->
    original) name the failure.

    Raises:
        BackendError: onnx2tf exited, raised, or returned no model; no ``onnxsim`` command
            (:func:`onnxsim_on_path`).
    """
    import onnx2tf

    from anpred.backends.convert import working_directory
    from anpred.backends.onnxsim_warm import warm_onnxsim

    scratch = src.parent
    try:
        # warm_onnxsim: onnx2tf's four onnxsim command runs go to one warm process (each
        # as new processes; anpred.backends.onnxsim_warm)
        with (
            working_directory(scratch),
            onnxsim_on_path(not o2t.get("not_use_onnxsim")),
            warm_onnxsim(),
            contextlib.redirect_stdout(log),
        ):
            km = onnx2tf.convert(
                input_onnx_file_path=str(src),
                output_folder_path=str(scratch / "o2t"),
                disable_model_save=True,
                non_verbose=True,
                **o2t,
            )
    except SystemExit as err:
        raise BackendError(
            f"onnx2tf failed on {model_name} (sys.exit({err.code})): {onnx2tf_errors(log.getvalue())}"
        ) from err
    except BackendError:
        raise
    except Exception as err:
        raise BackendError(
            f"onnx2tf failed on {model_name}{failed_op(log.getvalue(), renamed)}: "
            f"{type(err).__name__}: {first_line(_ANSI.sub('', str(err)))}"
        ) from err
    if km is None:
        raise BackendError(f"onnx2tf returned no model for {model_name}: {onnx2tf_errors(log.getvalue())}")
    return km


def converted_io(km, simplified, renamed_outputs: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """``{"outputs", "inputs"}`` of ``meta.json``: the keras model ``km``'s outputs in the order of the
    ONNX graph ``simplified`` (onnx2tf's onnxsim result) with the anchored model's output names
    (``renamed_outputs``: safe -> original), TF shapes and onnx2tf's channels-last flag; its inputs with
    their ONNX and TF shapes and TF dtype.

    Raises:
        BackendError: not one keras output per ONNX output.
    """
    safe = [o.name for o in simplified.graph.output]
    if len(safe) != len(km.outputs):
        raise BackendError(
            f"onnx2tf produced {len(km.outputs)} outputs for {len(safe)} ONNX outputs; cannot map them back to anchors"
        )
    names = [renamed_outputs.get(n, n) for n in safe]  # back to the anchored model's output names
    layouts = dict(getattr(km, "onnx_output_layouts", {}) or {})
    inits = {t.name for t in simplified.graph.initializer}
    onnx_inputs = [i for i in simplified.graph.input if i.name not in inits]
    return {
        "outputs": [
            {
                "value": n,
                "tf_shape": [d if d is None else int(d) for d in o.shape],
                "channels_last": bool(layouts.get(sn, False)),
            }
            for sn, n, o in zip(safe, names, km.outputs)
        ],
        "inputs": [
            {
                "name": i.name,
                "onnx_shape": [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim],
                "tf_shape": [d if d is None else int(d) for d in ki.shape],
                "dtype": ki.dtype.name if hasattr(ki.dtype, "name") else str(ki.dtype),
            }
            for i, ki in zip(onnx_inputs, km.inputs)
        ],
    }


def export_saved_model(km, folder: Path, log: io.StringIO) -> None:
    """Save the keras model ``km`` as a TF SavedModel in ``folder`` whose ``run`` endpoint returns the
    outputs as a list in the model's order (what the export prints goes to ``log``)."""
    import tensorflow as tf
    import tf_keras

    specs = [tf.TensorSpec(ki.shape, ki.dtype) for ki in km.inputs]

    def run(*xs):
        out = km(list(xs), training=False)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    # tf_keras's ExportArchive tracks the variables onnx2tf creates outside keras layers (a plain
    # tf.saved_model.save fails on PP-OCR with "references an 'untracked' resource").
    archive = tf_keras.export.ExportArchive()
    archive.track(km)
    archive.add_endpoint(name="run", fn=run, input_signature=specs)
    with contextlib.redirect_stdout(log):  # it prints the endpoint signatures
        archive.write_out(str(folder))


@contextlib.contextmanager
def onnxsim_on_path(required: bool):
    """Put the running interpreter's scripts folder (``sysconfig.get_path("scripts")``, e.g.
    ``.venv/bin``) first on ``PATH`` for the duration, and check that the ``onnxsim`` command is found.

    onnx2tf simplifies its input by running the *command* ``onnxsim`` in a subprocess
    (``onnx2tf.py``: ``subprocess.check_output(["onnxsim", ...])``); when a venv's Python is run
    without activating the venv, that command is not on ``PATH``, onnx2tf only warns (a warning
    ``non_verbose`` hides) and converts the unsimplified graph. On such graphs onnx2tf's ``Reshape``
    fails for a constant input of rank >= 3 (it transposes the NumPy constant into an eager tensor and
    builds a validation ``tf_keras.Model`` with it as output: "Output tensors of a Functional model must
    be the output of a TensorFlow `Layer` ... Found: [[[0.5 0.5] ..." on YOLOv8n's anchor grid at 640 px).

    Raises:
        BackendError: ``required`` and no ``onnxsim`` command in the scripts folder or on ``PATH``.
    """
    import os
    import sysconfig

    old = os.environ.get("PATH")
    scripts = sysconfig.get_path("scripts")
    os.environ["PATH"] = os.pathsep.join(p for p in (scripts, old) if p)
    try:
        if required and shutil.which("onnxsim") is None:
            raise BackendError(
                f"tf: the onnxsim command (package onnxsim) is not in {scripts} nor on PATH; "
                "onnx2tf would silently convert the unsimplified graph (install onnxsim, or pass "
                "the onnx2tf option not_use_onnxsim=True to accept that)"
            )
        yield
    finally:
        if old is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = old


def first_line(text: str, limit: int = 300) -> str:
    """The first line of an exception message, cut at ``limit`` characters (onnx2tf's messages may
    print a whole constant array)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit] + " ..."


def failed_op(log: str, renamed: dict[str, str] | None = None) -> str:
    """`` at ONNX node <name>`` from onnx2tf's ``onnx_op_name:`` error line, or ``""``; a node name that
    :func:`~anpred.backends.tf_prepare.tf_safe_node_names` changed is given as the model's (``renamed``:
    new -> original)."""
    m = re.search(r"onnx_op_name:\s*(\S+)", _ANSI.sub("", log))
    return f" at ONNX node {(renamed or {}).get(m.group(1), m.group(1))}" if m else ""


def fix_input_dims(model, shapes: dict[str, list[int]]) -> None:
    """Set the dims of the named graph inputs to ``shapes`` in place; graph output shapes and
    value_info (which may hold the old symbolic dims) are cleared for re-inference."""
    for vi in model.graph.input:
        if vi.name in shapes:
            for d, v in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                d.Clear()
                d.dim_value = int(v)
    del model.graph.value_info[:]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def onnx2tf_errors(log: str) -> str:
    """onnx2tf's ERROR lines (ANSI colours removed), else the log's last lines."""
    lines = [_ANSI.sub("", ln).strip() for ln in log.splitlines() if ln.strip()]
    errs = [ln for ln in lines if "ERROR" in ln]
    return " | ".join((errs or lines)[-6:]) or "no message"
