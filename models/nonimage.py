"""Real inputs of the zoo models that are not fed with one image: byte values and audio.

Each ``*_samples(zm, n, seed)`` function returns ``n`` samples ``[(source, {graph input name: array})]``
built the way the model's own wheel builds its inputs, nothing downloaded:

- :func:`magika_samples` (``magika``): the bytes of real files shipped by installed packages (a Python
  module, a JPEG photograph, JSON, PNG, PDF, gzip, Markdown, SVG, ONNX, TrueType, JavaScript, CSS, WAV;
  :data:`MAGIKA_FILES`), turned into the model's ``bytes`` features exactly as magika 1.0.3 does
  (:func:`magika_features`: ``Magika._extract_features_from_seekable``, features v2);
- :func:`silero_samples` (``silero-vad``): 512-sample chunks of a deterministic synthetic voiced
  signal at 16 kHz (:func:`synthetic_speech`; no speech recording ships in any installed package:
  the only ``.wav`` files are scipy's test tones), with the 64 context samples silero_vad's
  ``OnnxWrapper`` prepends and the recurrent state the model itself reaches on the preceding chunks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from anpred.errors import AnpredError

from models.packages import package_file

__all__ = [
    "MAGIKA_FILES",
    "magika_config",
    "magika_labels",
    "magika_features",
    "magika_samples",
    "SILERO_SR",
    "SILERO_CHUNK",
    "SILERO_CONTEXT",
    "synthetic_speech",
    "silero_stream",
    "silero_samples",
]


# ---- magika: byte values of real files ---------------------------------------------------------

#: Real files of installed packages ``(package, path inside it, magika's label for it)``, text and
#: binary formats alternating; the label is what magika 1.0.3 itself says (``Magika().identify_path``).
MAGIKA_FILES: tuple[tuple[str, str, str], ...] = (
    ("magika", "magika.py", "python"),
    ("ultralytics", "assets/bus.jpg", "jpeg"),
    ("magika", "models/standard_v3_3/config.min.json", "json"),
    ("matplotlib", "mpl-data/images/matplotlib.png", "png"),
    ("magika", "models/standard_v3_3/README.md", "markdown"),
    ("matplotlib", "mpl-data/images/matplotlib.pdf", "pdf"),
    ("matplotlib", "mpl-data/images/matplotlib.svg", "svg"),
    ("matplotlib", "mpl-data/sample_data/s1045.ima.gz", "gzip"),
    ("matplotlib", "backends/web_backend/js/mpl.js", "javascript"),
    ("magika", "models/standard_v3_3/model.onnx", "onnx"),
    ("matplotlib", "backends/web_backend/css/page.css", "css"),
    ("matplotlib", "mpl-data/fonts/ttf/DejaVuSans.ttf", "ttf"),
    ("scipy", "io/tests/data/test-44100Hz-le-1ch-4bytes.wav", "wav"),
)


def magika_config(model_path: str | Path) -> dict:
    """magika's model configuration, ``config.min.json`` next to the ``model.onnx`` file (``beg_size``,
    ``end_size``, ``block_size``, ``padding_token``, ``target_labels_space``, ...).

    Raises:
        AnpredError: the file is missing or is not the features-v2 layout this module implements
        (``mid_size`` 0, no inputs at offsets).
    """
    p = Path(model_path).parent / "config.min.json"
    if not p.is_file():
        raise AnpredError(f"{p}: magika's model configuration is missing next to {Path(model_path).name}")
    cfg = json.loads(p.read_text())
    if cfg.get("mid_size", 0) != 0 or cfg.get("use_inputs_at_offsets", False):
        raise AnpredError(f"{p}: mid_size/use_inputs_at_offsets features are not implemented (magika features v2 only)")
    return cfg


def magika_labels() -> tuple[str, ...] | None:
    """The 214 output labels of magika's installed ``standard_v3_3`` model (``target_labels_space``),
    None when magika is not installed."""
    try:
        return tuple(magika_config(package_file("magika", "models/standard_v3_3/model.onnx"))["target_labels_space"])
    except AnpredError:
        return None


def magika_features(
    data: bytes, beg_size: int = 1024, end_size: int = 1024, block_size: int = 4096, padding_token: int = 256
) -> np.ndarray:
    """magika's features v2 of a file's content: ``int32 (beg_size + end_size,)``, values 0..255 (bytes)
    or ``padding_token``.

    As ``magika.Magika._extract_features_from_seekable`` (magika 1.0.3): read at most ``block_size``
    bytes at the beginning and at the end; ``lstrip()`` the first (ASCII whitespace), ``rstrip()`` the
    second; ``beg``: the first ``beg_size`` bytes, padded at the end; ``end``: the last ``end_size``
    bytes, padded at the beginning; the model input is ``beg + end``.
    """
    n = min(block_size, len(data))
    beg = list(data[:n].lstrip()[:beg_size])
    beg += [padding_token] * (beg_size - len(beg))
    tail = data[len(data) - n :].rstrip()
    end = list(tail[max(0, len(tail) - end_size) :])
    end = [padding_token] * (end_size - len(end)) + end
    return np.asarray(beg + end, dtype=np.int32)


def magika_samples(zm, n: int, seed: int) -> list[tuple[str, dict[str, np.ndarray]]]:
    """``n`` samples ``{"bytes": int32 (1, 2048)}``: files ``MAGIKA_FILES[(seed + i) % 13]``.

    Raises:
        AnpredError: a file's package is not installed or the file is missing.
    """
    cfg = magika_config(zm.onnx_path())
    name = zm.entry.inputs[0].name
    out = []
    for i in range(n):
        pkg, rel, label = MAGIKA_FILES[(seed + i) % len(MAGIKA_FILES)]
        data = package_file(pkg, rel).read_bytes()
        x = magika_features(data, cfg["beg_size"], cfg["end_size"], cfg["block_size"], cfg["padding_token"])
        out.append((f"{pkg}/{rel} ({label}, {len(data)} bytes)", {name: x[None]}))
    return out


# ---- silero-vad: audio chunks ------------------------------------------------------------------

SILERO_SR = 16000
#: samples per chunk and context samples prepended, at 16 kHz (silero_vad.utils_vad.OnnxWrapper.__call__)
SILERO_CHUNK, SILERO_CONTEXT = 512, 64

# Peterson & Barney (1952) mean formants F1-F3 of adult male vowels (Hz) and bandwidths (Hz)
_VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410))
_BANDWIDTHS, _GAINS = (90, 110, 170), (1.0, 0.5, 0.25)


def _resonator(x: np.ndarray, f: float, bw: float) -> np.ndarray:
    """Second-order all-pole resonance at ``f`` Hz with bandwidth ``bw`` Hz (Klatt 1980)."""
    from scipy.signal import lfilter

    r = np.exp(-np.pi * bw / SILERO_SR)
    return lfilter([1.0 - r], [1.0, -2.0 * r * np.cos(2 * np.pi * f / SILERO_SR), r * r], x)


def _syllable(rng: np.random.Generator, dur: float, f0: float) -> np.ndarray:
    """A plosive burst then a voiced vowel, peak 1: impulse train at ``f0`` (vibrato and jitter),
    glottal low-pass, three formant resonators, lip radiation (first difference), 30 ms attack and
    50 ms release."""
    from scipy.signal import lfilter

    n = int(dur * SILERO_SR)
    t = np.arange(n) / SILERO_SR
    f = (
        f0
        * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(2, 4) * t + rng.uniform(0, 6)))
        * (1 + 0.01 * rng.standard_normal(n))
    )
    src = np.diff(np.floor(np.cumsum(f / SILERO_SR)), prepend=0.0)
    src = lfilter([1.0], [1.0, -0.5], lfilter([1.0], [1.0, -0.97], src))
    formants = _VOWELS[int(rng.integers(len(_VOWELS)))]
    y = sum(g * _resonator(src, fm, bw) for fm, bw, g in zip(formants, _BANDWIDTHS, _GAINS))
    y = np.diff(y, prepend=0.0) * np.clip(np.minimum(t / 0.03, (dur - t) / 0.05), 0, 1)
    nb = int(0.04 * SILERO_SR)
    burst = np.diff(rng.standard_normal(nb) * np.linspace(1, 0, nb), prepend=0.0)
    return np.concatenate([0.3 * burst / np.abs(burst).max(), y / np.abs(y).max()])


def synthetic_speech(seed: int, segments: int) -> tuple[np.ndarray, list[tuple[int, int]], list[tuple[int, int]]]:
    """A deterministic speech-like signal at 16 kHz: ``segments`` utterances of 6 syllables (peak
    0.5, 0.15-0.3 s each, F0 100-150 Hz, 10-50 ms gaps) between pauses of 0.8 s (0.6 s first) of
    low noise (standard deviation 0.002).

    Returns:
        ``(audio float32 (samples,), speech [(start, stop)], pauses [(start, stop)])`` in samples;
        pause ``j`` precedes utterance ``j``, the last pause follows the last utterance.
    """
    rng = np.random.default_rng(seed)
    parts, speech, pauses, pos = [], [], [], 0

    def add(x, where=None):
        nonlocal pos
        parts.append(x)
        if where is not None:
            where.append((pos, pos + len(x)))
        pos += len(x)

    for j in range(segments + 1):
        add(0.002 * rng.standard_normal(int((0.6 if j == 0 else 0.8) * SILERO_SR)), pauses)
        if j == segments:
            break
        start = pos
        for _ in range(6):
            add(0.5 * _syllable(rng, rng.uniform(0.15, 0.3), rng.uniform(100, 150)))
            add(0.002 * rng.standard_normal(int(rng.uniform(0.01, 0.05) * SILERO_SR)))
        speech.append((start, pos))
    return np.concatenate(parts).astype(np.float32), speech, pauses


def silero_stream(model_path: str | Path, audio: np.ndarray, chunks: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Run a silero-vad ONNX model on the first ``chunks`` chunks of ``audio`` the way silero_vad's
    ``OnnxWrapper`` streams (ONNX Runtime, CPU): chunk ``k`` is fed as ``input (1, 576)`` = the last
    64 samples of chunk ``k - 1``'s input (zeros for ``k = 0``) + samples ``512k .. 512k + 511``, with
    the ``stateN`` of chunk ``k - 1`` (zeros for ``k = 0``) and ``sr = 16000``.

    Returns:
        ``(states, probabilities)``: ``states[k]`` float32 (2, 1, 128) is the state fed with chunk ``k``
        (``chunks + 1`` of them, the last one after every chunk); speech probabilities float32 (chunks,).
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros((1, SILERO_CONTEXT), np.float32)
    states, probs = [state], []
    for k in range(chunks):
        x = np.concatenate([context, audio[None, k * SILERO_CHUNK : (k + 1) * SILERO_CHUNK]], axis=1)
        out, state = sess.run(["output", "stateN"], {"input": x, "state": state, "sr": np.array(SILERO_SR, np.int64)})
        context = x[:, -SILERO_CONTEXT:]
        states.append(np.asarray(state, np.float32))
        probs.append(float(np.asarray(out).reshape(-1)[0]))
    return states, np.asarray(probs, np.float32)


def silero_samples(zm, n: int, seed: int) -> list[tuple[str, dict[str, np.ndarray]]]:
    """``n`` chunks of :func:`synthetic_speech` (``seed``), voiced and silent alternately: sample
    ``2j`` is the loudest chunk of utterance ``j``, sample ``2j + 1`` the last whole chunk of the pause
    after it (0.5 s or more after the speech ended). Each sample is ``{"input": float32 (1, 576),
    "state": float32 (2, 1, 128), "sr": int64 () = 16000}``: the chunk with its 64 context samples and
    the model's own state after the preceding chunks (:func:`silero_stream` on the zoo model's ONNX
    file with ONNX Runtime), i.e. exactly what silero_vad feeds at that point of a stream.
    """
    segments = max(1, (n + 1) // 2)
    audio, speech, pauses = synthetic_speech(seed, segments)
    chunk_rms = np.sqrt(np.mean(audio[: len(audio) // SILERO_CHUNK * SILERO_CHUNK].reshape(-1, SILERO_CHUNK) ** 2, 1))
    picks = []
    for i in range(n):
        j = i // 2
        if i % 2 == 0:
            lo, hi = -(-speech[j][0] // SILERO_CHUNK), speech[j][1] // SILERO_CHUNK
            picks.append((int(lo + np.argmax(chunk_rms[lo:hi])), "voiced", j))
        else:
            picks.append((pauses[j + 1][1] // SILERO_CHUNK - 1, "silence", j))
    states, probs = silero_stream(zm.onnx_path(), audio, max(k for k, _, _ in picks) + 1)
    out = []
    for k, kind, j in picks:
        start = k * SILERO_CHUNK
        ctx = audio[max(0, start - SILERO_CONTEXT) : start]
        x = np.concatenate([np.zeros(SILERO_CONTEXT - len(ctx), np.float32), ctx, audio[start : start + SILERO_CHUNK]])
        src = (
            f"synthetic speech seed {seed}: {kind} chunk {k} (t = {start / SILERO_SR:.3f} s, "
            f"{'utterance' if kind == 'voiced' else 'pause after utterance'} {j}), state after {k} chunks"
        )
        out.append(
            (src, {"input": x[None].astype(np.float32), "state": states[k], "sr": np.array(SILERO_SR, dtype=np.int64)})
        )
    return out
