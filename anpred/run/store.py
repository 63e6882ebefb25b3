"""The run store: a self-describing folder holding what every backend saw on every sample.

Layout (schema ``anpred.run/1``; written by :func:`anpred.run.driver.run_model` and its workers)::

    RUN_DIR/
      run.json                  # schema, created, model identity, inputs description, machine,
                                # mode ("tensors" | "stats"), backends: name -> BackendStatus;
                                # backend_specs, resources (per backend: written by the driver)
      manifest.json             # the AnchorManifest of the anchored model
      model.onnx                # the anchored model (copied or linked) when available
      inputs/<sample>.safetensors  # graph inputs of each sample (keys: graph input names; .npz for
                                # dtypes safetensors lacks, and in runs of earlier versions)
      tensors/<backend>/<sample>.safetensors  # anchors as the backend returned them (keys: anchor
                                # names; see anpred.tensorfile). A sample holding a dtype safetensors
                                # lacks (bfloat16, strings) is tensors/<backend>/<sample>.npz instead
                                # (keys: file_key(anchor)); runs of earlier versions are all .npz
      stats/<backend>.json      # mode "stats": streaming summaries per anchor instead of tensors
      stats/<backend>.samples.jsonl  # mode "stats": one line of per-sample summaries per sample
                                # (both: anpred.run.streaming)
      logs/<backend>.log        # the backend worker's stdout/stderr (faulthandler tracebacks)

Sample ids are strings (``s0000``, ``s0001`` ...) in run order. Arrays are stored in the dtype and
layout the backend returned; alignment is applied when reading for judgement.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from anpred.backends.base import BackendStatus
from anpred.errors import AnpredError, OutputPathError
from anpred.manifest import AnchorManifest
from anpred.naming import file_key, from_file_key
from anpred.onnx_io import atomic_write_text, to_json
from anpred.tensorfile import read_array_file, storable, write_safetensors

__all__ = ["SCHEMA", "RunStore", "sample_sha256"]

SCHEMA = "anpred.run/1"


def sample_sha256(inputs: dict[str, np.ndarray]) -> str:
    """A sample's identity: SHA-256 over its input names (sorted) and each array's bytes (C order)."""
    import hashlib

    h = hashlib.sha256()
    for k in sorted(inputs):
        h.update(k.encode())
        a = np.ascontiguousarray(inputs[k])
        if a.size:  # (an empty array has no bytes, and memoryview refuses to cast a zero-length view)
            h.update(memoryview(a).cast("B"))  # the same bytes, no copy
    return h.hexdigest()


class RunStore:
    """Reader/writer for one run folder."""

    def __init__(self, root: str | Path, meta: dict[str, Any], manifest: AnchorManifest):
        self.root = Path(root)
        self.meta = meta
        self.manifest = manifest

    # ---- creation / opening --------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        root: str | Path,
        manifest: AnchorManifest,
        *,
        model: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        mode: str = "tensors",
        overwrite: bool = False,
    ) -> "RunStore":
        """Create a new run folder. Raises OutputPathError if ``root`` already holds a run (unless
        ``overwrite``) or any other non-empty folder, or cannot be created."""
        root = Path(root)
        if root.exists():
            if not root.is_dir():
                raise OutputPathError(f"{root} exists and is not a folder")
            if any(root.iterdir()):
                if (root / "run.json").exists() and overwrite:
                    shutil.rmtree(root)
                elif (root / "run.json").exists():
                    raise OutputPathError(f"{root} already holds a run; choose another -o or pass --overwrite")
                else:
                    raise OutputPathError(f"{root} exists and is not empty; nothing was written")
        try:
            root.mkdir(parents=True, exist_ok=True)
            (root / "inputs").mkdir(exist_ok=True)
            (root / "tensors").mkdir(exist_ok=True)
        except OSError as err:
            raise OutputPathError(f"cannot create run folder {root}: {err.strerror or err}") from err
        from anpred.machine import machine_info

        meta = {
            "schema": SCHEMA,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "model": model or {},
            "inputs": inputs or {},
            "machine": machine_info(),
            "mode": mode,
            "samples": [],
            "backends": {},
        }
        store = cls(root, meta, manifest)
        manifest.save(root / "manifest.json")
        store.save_meta()
        return store

    @classmethod
    def open(cls, root: str | Path) -> "RunStore":
        """Open an existing run folder. Raises AnpredError when it is not one."""
        root = Path(root)
        try:
            meta = json.loads((root / "run.json").read_text())
        except FileNotFoundError as err:
            raise AnpredError(f"{root} is not a run folder (no run.json)") from err
        except (OSError, json.JSONDecodeError) as err:
            raise AnpredError(f"{root}/run.json is unreadable: {err}") from err
        if meta.get("schema") != SCHEMA:
            raise AnpredError(f"{root}: unsupported run schema {meta.get('schema')!r} (expected {SCHEMA!r})")
        manifest = AnchorManifest.load(root / "manifest.json")
        return cls(root, meta, manifest)

    def save_meta(self) -> None:
        atomic_write_text(self.root / "run.json", to_json(self.meta, indent=2))

    # ---- samples and inputs --------------------------------------------------------------------
    @property
    def sample_ids(self) -> list[str]:
        return [s["id"] for s in self.meta["samples"]]

    def add_sample(
        self,
        sample_id: str,
        inputs: dict[str, np.ndarray],
        source: str = "",
        extra: dict[str, Any] | None = None,
        prewritten: tuple[str, Path] | None = None,
    ) -> None:
        """Record a sample (its :func:`sample_sha256`) and store its graph inputs. ``prewritten``:
        ``(sha256, file)`` computed and written beforehand for exactly these ``inputs`` (a streamed
        dataset's reader thread, :class:`anpred.inputs.ArraySamples`): the ``.safetensors`` file is
        moved in instead of written (written again where it cannot be moved)."""
        moved = False
        if prewritten is not None:
            digest = prewritten[0]
            try:
                os.replace(prewritten[1], self.root / "inputs" / f"{sample_id}.safetensors")
                moved = True
            except OSError:
                pass
        else:
            digest = sample_sha256(inputs)
        if moved:
            pass
        elif storable(inputs):  # buffered: every backend reads it again
            write_safetensors(self.root / "inputs" / f"{sample_id}.safetensors", inputs, direct=False)
        else:
            np.savez(self.root / "inputs" / f"{sample_id}.npz", **inputs)
        self.meta["samples"].append({"id": sample_id, "source": source, "sha256": digest, **(extra or {})})

    def adopt_sample(self, sample_id: str, other: "RunStore", other_id: str, source: str = "") -> None:
        """Record sample ``other_id`` of the run ``other`` here as ``sample_id``: its input file and every
        backend's anchor file are moved (``os.replace``; where they cannot be, e.g. another file
        system, copied to a temporary name, renamed, then the original removed: no half-written file
        takes the name; a failure part-way leaves the files moved before it here, without a record),
        its SHA-256 taken from ``other``'s record. ``other`` loses those files: for a run
        about to be deleted (a streamed dataset's chunk, :mod:`anpred.pipeline.stream`).

        Raises:
            KeyError: ``other`` has no sample ``other_id``.
            FileNotFoundError: it has no input file for it."""
        rec = next((s for s in other.meta["samples"] if s["id"] == other_id), None)
        if rec is None:
            raise KeyError(f"{other.root}: no sample {other_id}")
        moves = [(other.input_file(other_id), self.root / "inputs")]
        for b in other.meta["backends"]:
            f = other.anchor_file(b, other_id)
            if f is not None:
                moves.append((f, self.backend_dir(b)))
        for f, folder in moves:
            folder.mkdir(parents=True, exist_ok=True)
            dst = folder / f"{sample_id}{f.suffix}"
            try:
                os.replace(f, dst)
            except OSError:  # copied under a temporary name, then renamed: no half-written file at dst
                tmp = dst.with_name(dst.name + ".part")
                try:
                    shutil.copyfile(f, tmp)
                    os.replace(tmp, dst)
                finally:
                    tmp.unlink(missing_ok=True)
                f.unlink(missing_ok=True)  # moved, as os.replace would have
        self.meta["samples"].append(
            {
                "id": sample_id,
                "source": source,
                "sha256": rec.get("sha256") or sample_sha256(self.read_inputs(sample_id)),
            }
        )

    def remove_sample(self, sample_id: str) -> None:
        """Forget a sample: its inputs, every backend's tensors for it and its entry (meta saved by the
        caller)."""
        for p in list((self.root / "inputs").glob(f"{sample_id}.*")) + list(
            (self.root / "tensors").glob(f"*/{sample_id}.*")
        ):
            p.unlink(missing_ok=True)
        self.meta["samples"] = [s for s in self.meta["samples"] if s["id"] != sample_id]

    def input_file(self, sample_id: str) -> Path:
        """The file holding one sample's graph inputs (``inputs/<sample>.safetensors``, or ``.npz``).
        Raises FileNotFoundError when neither exists."""
        for ext in (".safetensors", ".npz"):
            p = self.root / "inputs" / f"{sample_id}{ext}"
            if p.exists():
                return p
        raise FileNotFoundError(f"{self.root / 'inputs'}: no input file for sample {sample_id}")

    def read_inputs(self, sample_id: str) -> dict[str, np.ndarray]:
        """One sample's graph inputs (input name -> array)."""
        return read_array_file(self.input_file(sample_id))

    # ---- anchors -------------------------------------------------------------------------------
    def backend_dir(self, backend: str) -> Path:
        return self.root / "tensors" / backend

    def write_anchors(self, backend: str, sample_id: str, anchors: dict[str, np.ndarray]) -> None:
        """Store one sample's anchors for ``backend`` (safe to call from a backend's own process, one
        writer thread per process): ``tensors/<backend>/<sample>.safetensors`` written with direct I/O
        (:func:`anpred.tensorfile.write_safetensors`), or ``.npz`` when a dtype has no safetensors
        dtype. Atomic: written under a temporary name, then renamed."""
        d = self.backend_dir(backend)
        d.mkdir(parents=True, exist_ok=True)
        arrays = {k: np.asarray(v) for k, v in anchors.items()}
        if storable(arrays):
            tmp = d / f".{sample_id}.tmp.safetensors"
            write_safetensors(tmp, arrays)
            os.replace(tmp, d / f"{sample_id}.safetensors")
        else:
            tmp = d / f".{sample_id}.tmp.npz"
            np.savez(tmp, **{file_key(k): v for k, v in arrays.items()})
            os.replace(tmp, d / f"{sample_id}.npz")

    def anchor_file(self, backend: str, sample_id: str) -> Path | None:
        """The file holding ``backend``'s anchors of one sample (``.safetensors`` or ``.npz``), or None."""
        d = self.backend_dir(backend)
        for ext in (".safetensors", ".npz"):
            p = d / f"{sample_id}{ext}"
            if p.exists():
                return p
        return None

    def read_anchors(self, backend: str, sample_id: str) -> dict[str, np.ndarray]:
        """Anchors of one backend and sample (empty dict when that backend stored none), keyed by
        anchor name in the order the backend returned them. Raises ValueError/OSError (or
        zipfile.BadZipFile for ``.npz``) for an unreadable file."""
        p = self.anchor_file(backend, sample_id)
        if p is None:
            return {}
        return read_array_file(p, keys=from_file_key)

    def iter_samples(self, backends: list[str] | None = None) -> Iterator[tuple[str, dict[str, dict[str, np.ndarray]]]]:
        """Yield ``(sample_id, {backend: {anchor: array}})`` one sample at a time (streaming)."""
        backends = backends or self.ok_backends()
        for sid in self.sample_ids:
            yield sid, {b: self.read_anchors(b, sid) for b in backends}

    # ---- backend status ------------------------------------------------------------------------
    def set_status(self, status: BackendStatus) -> None:
        self.meta["backends"][status.name] = status.to_dict()
        self.save_meta()

    def statuses(self) -> dict[str, BackendStatus]:
        return {k: BackendStatus.from_dict(v) for k, v in self.meta["backends"].items()}

    def ok_backends(self) -> list[str]:
        return [k for k, v in self.meta["backends"].items() if v["status"] == "ok"]
