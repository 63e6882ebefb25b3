"""Real inputs: the photographs shipped with ultralytics and seeded, rendered document pages.

Pages (:func:`render_page`) are drawn with Pillow's own scalable default font
(``ImageFont.load_default(size=...)``, no system font needed): page header, title, paragraphs,
section headers, a bulleted list, a table with a caption, a figure (a chart) with a caption and a
page footer. Every drawn block's bounding box is returned under its DocLayNet class name, so a
layout detector's output can be checked against the drawing.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from anpred.errors import AnpredError

DOCLAYNET_CLASSES = (
    "Caption",
    "Footnote",
    "Formula",
    "List-item",
    "Page-footer",
    "Page-header",
    "Picture",
    "Section-header",
    "Table",
    "Text",
    "Title",
)

_WORDS = (
    "the model of data layer network result method value test error output input precision analysis "
    "system library runtime tensor graph stage anchor float kernel accuracy signal image page table figure "
    "measure sample report number section order mean range rate time memory level process device backend "
    "shows gives where which under over between each after before most least small large first second "
    "results methods values tests errors outputs inputs layers stages anchors kernels samples reports "
    "compute compare detect locate convert export evaluate observe estimate improve reduce increase define "
    "is are was were be has have can may will should must not also only both either while since"
).split()


def _asset_dir() -> Path:
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        raise AnpredError("the ultralytics package is not installed: its photographs (assets) are needed")
    return Path(list(spec.submodule_search_locations)[0]) / "assets"


@lru_cache(maxsize=1)
def _photos() -> tuple[np.ndarray, ...]:
    from PIL import Image

    out = []
    for name in ("bus.jpg", "zidane.jpg"):
        p = _asset_dir() / name
        if not p.is_file():
            raise AnpredError(f"{p}: photograph missing from the ultralytics package")
        with Image.open(p) as im:
            arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
        arr.setflags(write=False)
        out.append(arr)
    return tuple(out)


def photos() -> list[np.ndarray]:
    """The two photographs in ``ultralytics/assets`` (bus.jpg 1080x810, zidane.jpg 720x1280), as
    read-only ``(H, W, 3)`` uint8 RGB arrays."""
    return list(_photos())


@lru_cache(maxsize=16)
def font(size: int):
    """Pillow's scalable default font at ``size`` pixels (needs Pillow >= 10.1 with FreeType)."""
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


@dataclass
class Page:
    """A rendered page: ``image`` (PIL RGB), ``regions`` {DocLayNet class: [xyxy boxes in pixels]},
    ``lines`` [(xyxy box, text)] for every drawn line of text."""

    image: object
    regions: dict[str, list[tuple[float, float, float, float]]] = field(default_factory=dict)
    lines: list[tuple[tuple[float, float, float, float], str]] = field(default_factory=list)

    def add(self, cls: str, box) -> None:
        self.regions.setdefault(cls, []).append(tuple(float(v) for v in box))

    def array(self) -> np.ndarray:
        return np.asarray(self.image.convert("RGB"), dtype=np.uint8)


def _sentence(rng, lo=6, hi=14) -> str:
    words = [str(rng.choice(_WORDS)) for _ in range(int(rng.integers(lo, hi + 1)))]
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def _wrap(draw, text: str, fnt, width: int) -> list[str]:
    lines, cur = [], ""
    for w in text.split():
        cand = f"{cur} {w}".strip()
        if cur and draw.textlength(cand, font=fnt) > width:
            lines.append(cur)
            cur = w
        else:
            cur = cand
    if cur:
        lines.append(cur)
    return lines


def _union(boxes):
    b = np.asarray(boxes, dtype=np.float64)
    return (b[:, 0].min(), b[:, 1].min(), b[:, 2].max(), b[:, 3].max())


class _Writer:
    def __init__(self, page: Page, draw, left: int, right: int):
        self.page, self.draw, self.left, self.right = page, draw, left, right

    def text_block(
        self,
        lines: list[str],
        y: float,
        fnt,
        x: float | None = None,
        gap: float = 1.3,
        fill=(0, 0, 0),
        center: bool = False,
        stroke: int = 0,
    ):
        boxes = []
        size = fnt.size
        for line in lines:
            xx = self.left if x is None else x
            if center:
                xx = (self.left + self.right) / 2 - self.draw.textlength(line, font=fnt) / 2
            self.draw.text((xx, y), line, font=fnt, fill=fill, stroke_width=stroke, stroke_fill=fill)
            box = self.draw.textbbox((xx, y), line, font=fnt, stroke_width=stroke)
            self.page.lines.append((tuple(float(v) for v in box), line))
            boxes.append(box)
            y += size * gap
        return _union(boxes), y


PAGE_CLASSES = (
    "Title",
    "Text",
    "List-item",
    "Table",
    "Picture",
    "Caption",
    "Section-header",
    "Page-header",
    "Page-footer",
)


def render_page(seed: int = 0, size: tuple[int, int] = (1024, 1280)) -> Page:
    """Render a seeded document page of ``size`` = (W, H) pixels, white background.

    Layout (one column, margins 8 % of the width): page header, title, paragraph, table with caption,
    section header, paragraph, figure (bar or line chart) with caption, bulleted list, paragraphs
    while space remains, page footer. Font sizes scale with the page width. The same seed gives the
    same pixels. When the seeded text leaves no room for the figure or the first list item, the page
    is drawn again, compacted: without the paragraph after the section header, then also with a
    lower figure (12 % instead of 20 % of the height).

    Args:
        seed: a non-negative integer.
        size: (W, H) in pixels, each at least 256.
    Returns:
        a :class:`Page` whose ``regions`` holds every class of :data:`PAGE_CLASSES`: "Title", "Text",
        "List-item", "Table", "Picture", "Caption", "Section-header", "Page-header", "Page-footer"
        (checked for seeds 0..39 at the default size by tests/test_zoo.py).
    Raises:
        AnpredError: a negative or non-integer seed, a page smaller than 256x256.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise AnpredError(f"page seed must be a non-negative integer, got {seed!r}")
    try:
        W, H = int(size[0]), int(size[1])
    except (TypeError, ValueError, IndexError) as err:
        raise AnpredError(f"page size must be (W, H) integers, got {size!r}") from err
    if W < 256 or H < 256:
        raise AnpredError(f"page size {size} too small (at least 256x256)")
    for compact in (0, 1, 2):
        page = _render_page(int(seed), W, H, compact)
        if all(c in page.regions for c in PAGE_CLASSES):
            break
    return page


def _render_page(seed: int, W: int, H: int, compact: int) -> Page:
    """One drawing of :func:`render_page`'s layout, top to bottom (the random draws in this order);
    ``compact`` 1 leaves out the paragraph after the section header, 2 also lowers the figure."""
    d = _PageDraw(seed, W, H)
    d.header_footer()
    y = d.title(int(0.07 * H))
    y = d.paragraph(y) or y
    y = d.table(y)
    y = d.section_header(y)
    if compact:
        d.paragraph(d.bottom)  # the same random draws, nothing drawn: room for the figure and the list
    else:
        y = d.paragraph(y) or y
    y = d.figure(y, int(H * (0.12 if compact >= 2 else 0.2)))
    y = d.bulleted_list(y)
    y += d.gap / 2
    while True:
        ny = d.paragraph(y)
        if ny is None:
            break
        y = ny
    return d.page


class _PageDraw:
    """A page being drawn: its seeded generator, canvas, fonts (scaled with the width ``W``) and
    column; each block method draws at height ``y`` (pixels) and returns the height below it."""

    def __init__(self, seed: int, W: int, H: int):
        from PIL import Image, ImageDraw

        self.rng = rng = np.random.default_rng(seed)
        img = Image.new("RGB", (W, H), (255, 255, 255))
        self.draw = ImageDraw.Draw(img)
        self.page = Page(image=img)
        self.W, self.H = W, H
        self.s = s = W / 1024
        margin = int(0.08 * W)
        self.left, self.right = margin, W - margin
        self.width = self.right - self.left
        self.wr = _Writer(self.page, self.draw, self.left, self.right)
        self.f_small, self.f_body = font(max(8, int(15 * s))), font(max(9, int(19 * s)))
        self.f_sec, self.f_title = font(max(10, int(26 * s))), font(max(12, int(int(rng.integers(54, 62)) * s)))
        self.gap = int(22 * s)
        self.bottom = int(0.93 * H)

    def header_footer(self) -> None:
        rng, draw, wr, page, f_small, W, H = self.rng, self.draw, self.wr, self.page, self.f_small, self.W, self.H
        hdr = f"{' '.join(str(rng.choice(_WORDS)) for _ in range(3)).title()} - Vol. {int(rng.integers(1, 40))}"
        box, _ = wr.text_block([hdr], int(0.03 * H), f_small, fill=(90, 90, 90))
        page.add("Page-header", box)
        num = str(int(rng.integers(1, 300)))
        box, _ = wr.text_block(
            [num], int(0.955 * H), f_small, x=W / 2 - draw.textlength(num, font=f_small) / 2, fill=(90, 90, 90)
        )
        page.add("Page-footer", box)

    def title(self, y: float) -> float:
        """The title (centred, stroked) and the author line below it."""
        rng, wr, page, gap = self.rng, self.wr, self.page, self.gap
        title = " ".join(str(rng.choice(_WORDS)) for _ in range(int(rng.integers(6, 10)))).title()
        box, y = wr.text_block(
            _wrap(self.draw, title, self.f_title, int(0.8 * self.width)),
            y,
            self.f_title,
            gap=1.2,
            center=True,
            stroke=max(1, int(1.5 * self.s)),
        )
        page.add("Title", box)
        y += gap / 2
        authors = ", ".join(
            f"{str(rng.choice(_WORDS)).title()} {chr(65 + int(rng.integers(0, 26)))}."
            for _ in range(int(rng.integers(2, 5)))
        )
        box, y = wr.text_block([authors], y, self.f_body, center=True)
        page.add("Text", box)
        return y + gap

    def paragraph(self, y: float, n_lo: int = 2, n_hi: int = 4) -> float | None:
        """A paragraph of ``n_lo``..``n_hi`` sentences; None (nothing drawn) when it would pass the bottom."""
        f_body = self.f_body
        text = " ".join(_sentence(self.rng) for _ in range(int(self.rng.integers(n_lo, n_hi + 1))))
        lines = _wrap(self.draw, text, f_body, self.width)
        if y + len(lines) * f_body.size * 1.35 > self.bottom:
            return None
        box, y = self.wr.text_block(lines, y, f_body, gap=1.35)
        self.page.add("Text", box)
        return y + self.gap

    def table(self, y: float) -> float:
        """A ruled table of words and numbers with its caption above."""
        rng, draw, s, width, f_body, f_small = self.rng, self.draw, self.s, self.width, self.f_body, self.f_small
        ncol, nrow = int(rng.integers(3, 6)), int(rng.integers(4, 8))
        cap = f"Table {int(rng.integers(1, 9))}: " + _sentence(rng, 4, 8)
        box, y = self.wr.text_block(_wrap(draw, cap, f_small, width), y, f_small)
        self.page.add("Caption", box)
        y += int(6 * s)
        row_h = int(f_body.size * 1.7)
        tw = int(width * rng.uniform(0.7, 1.0))
        tx0 = self.left + (width - tw) // 2
        col_w = tw / ncol
        ty0 = y
        for r in range(nrow + 1):
            draw.line(
                [(tx0, ty0 + r * row_h), (tx0 + tw, ty0 + r * row_h)],
                fill=(0, 0, 0),
                width=2 if r in (0, 1, nrow) else 1,
            )
        for c in range(ncol + 1):
            draw.line([(tx0 + c * col_w, ty0), (tx0 + c * col_w, ty0 + nrow * row_h)], fill=(0, 0, 0), width=1)
        for r in range(nrow):
            for c in range(ncol):
                if r == 0:
                    cell = str(rng.choice(_WORDS)).capitalize()
                elif c == 0:
                    cell = str(rng.choice(_WORDS))
                else:
                    cell = f"{rng.uniform(0, 100):.{int(rng.integers(1, 4))}f}"
                draw.text(
                    (tx0 + c * col_w + 6 * s, ty0 + r * row_h + 0.3 * f_body.size), cell, font=f_body, fill=(0, 0, 0)
                )
        self.page.add("Table", (tx0, ty0, tx0 + tw, ty0 + nrow * row_h))
        return ty0 + nrow * row_h + 1.5 * self.gap

    def section_header(self, y: float) -> float:
        rng = self.rng
        number = int(rng.integers(1, 6))  # drawn before the words: a seed keeps giving the same page
        sec = f"{number}. " + " ".join(str(rng.choice(_WORDS)) for _ in range(int(rng.integers(1, 4)))).title()
        box, y = self.wr.text_block([sec], y, self.f_sec)
        self.page.add("Section-header", box)
        return y + self.gap / 2

    def figure(self, y: float, fh: int) -> float:
        """A bar or line chart ``fh`` pixels high with its caption below, when it fits above the bottom."""
        rng, draw, page, width, gap = self.rng, self.draw, self.page, self.width, self.gap
        if y + fh + 3 * gap >= self.bottom:
            return y
        fw = int(width * rng.uniform(0.5, 0.8))
        fx0 = self.left + (width - fw) // 2
        fy0 = int(y)
        draw.rectangle([fx0, fy0, fx0 + fw, fy0 + fh], fill=(245, 245, 250), outline=(60, 60, 60))
        ax0, ay1 = fx0 + int(0.1 * fw), fy0 + int(0.9 * fh)
        draw.line([(ax0, fy0 + 0.08 * fh), (ax0, ay1), (fx0 + 0.95 * fw, ay1)], fill=(0, 0, 0), width=2)
        k = int(rng.integers(5, 10))
        vals = rng.uniform(0.15, 0.95, size=k)
        step = (0.83 * fw) / k
        if rng.random() < 0.5:
            colors = [(70, 110, 200), (220, 120, 60), (80, 170, 90)]
            for i, v in enumerate(vals):
                bx = ax0 + (i + 0.2) * step
                draw.rectangle([bx, ay1 - v * 0.8 * fh, bx + 0.6 * step, ay1], fill=colors[i % 3])
        else:
            pts = [(ax0 + (i + 0.5) * step, ay1 - v * 0.8 * fh) for i, v in enumerate(vals)]
            draw.line(pts, fill=(200, 50, 50), width=3)
            for px, py in pts:
                draw.ellipse([px - 4, py - 4, px + 4, py + 4], fill=(40, 40, 160))
        page.add("Picture", (fx0, fy0, fx0 + fw, fy0 + fh))
        y = fy0 + fh + gap / 2
        cap = f"Figure {int(rng.integers(1, 9))}: " + _sentence(rng, 5, 10)
        box, y = self.wr.text_block(_wrap(draw, cap, self.f_small, width), y, self.f_small)
        page.add("Caption", box)
        return y + gap

    def bulleted_list(self, y: float) -> float:
        """2-4 bulleted items, as many as fit above the bottom."""
        rng, draw, s, left, f_body = self.rng, self.draw, self.s, self.left, self.f_body
        for _ in range(int(rng.integers(2, 5))):
            lines = _wrap(draw, _sentence(rng, 5, 16), f_body, self.width - int(30 * s))
            if y + len(lines) * f_body.size * 1.35 > self.bottom:
                break
            r = f_body.size * 0.18
            cy = y + f_body.size * 0.55
            draw.ellipse([left + 8 * s - r, cy - r, left + 8 * s + r, cy + r], fill=(0, 0, 0))
            box, y = self.wr.text_block(lines, y, f_body, x=left + int(30 * s), gap=1.35)
            self.page.add("List-item", (left + 8 * s - r, min(box[1], cy - r), box[2], box[3]))
            y += self.gap / 3
        return y


def render_text_line(seed: int = 0, height: int = 48, max_width: int = 320) -> tuple[np.ndarray, str]:
    """A seeded single line of text (2-4 words or numbers), black on white, ``height`` pixels high
    and at most ``max_width`` wide: ``((height, w, 3) uint8 RGB, text)``. Input of the text
    recogniser."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    parts = [
        str(rng.choice(_WORDS)) if rng.random() < 0.75 else f"{rng.uniform(0, 1000):.1f}"
        for _ in range(int(rng.integers(2, 5)))
    ]
    fnt = font(int(height * 0.6))
    text = " ".join(parts)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    while len(parts) > 1 and probe.textlength(text, font=fnt) + 16 > max_width:
        parts.pop()
        text = " ".join(parts)
    w = int(min(max_width, probe.textlength(text, font=fnt) + 16))
    img = Image.new("RGB", (w, height), (255, 255, 255))
    ImageDraw.Draw(img).text((8, height * 0.15), text, font=fnt, fill=(0, 0, 0))
    return np.asarray(img, dtype=np.uint8), text


def write_pages_with_truth(folder, seeds, input_hw: tuple[int, int] = (1024, 1024)) -> dict:
    """Render the pages of ``seeds`` into ``folder`` (``page-<seed>.png``) and return their ground truth
    as COCO-style JSON (a dict; written beside them as ``truth.json``) in the pixels of a detector's
    input of ``input_hw`` = (H, W): every drawn block's box mapped through the same letterbox as the
    ultralytics preprocessing (:func:`models.detect.letterbox`: ``box * ratio + pad``), ``category_id``
    = DocLayNet class index + 1 (:data:`DOCLAYNET_CLASSES`), ``file_name`` = the PNG's name.

    Raises:
        AnpredError: as :func:`render_page`.
    """
    import json

    from models.detect import letterbox

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for i, seed in enumerate(seeds):
        page = render_page(int(seed))
        name = f"page-{int(seed):04d}.png"
        page.image.save(folder / name)
        _, info = letterbox(page.array(), input_hw)
        images.append({"id": i + 1, "file_name": name, "width": int(input_hw[1]), "height": int(input_hw[0])})
        for cls, boxes in page.regions.items():
            for b in boxes:
                x0, y0 = b[0] * info.ratio + info.pad[0], b[1] * info.ratio + info.pad[1]
                x1, y1 = b[2] * info.ratio + info.pad[0], b[3] * info.ratio + info.pad[1]
                anns.append(
                    {
                        "id": len(anns) + 1,
                        "image_id": i + 1,
                        "category_id": DOCLAYNET_CLASSES.index(cls) + 1,
                        "bbox": [x0, y0, x1 - x0, y1 - y0],
                        "area": (x1 - x0) * (y1 - y0),
                        "iscrowd": 0,
                    }
                )
    coco = {
        "images": images,
        "annotations": anns,
        "categories": [{"id": i + 1, "name": n} for i, n in enumerate(DOCLAYNET_CLASSES)],
    }
    (folder / "truth.json").write_text(json.dumps(coco))
    return coco
