"""A tiny PNG line-plot writer (zlib + struct only), so benchmarks need no matplotlib.

`line_plot` draws series of (x, y) points on log2-x / linear-y axes with tick labels, a title
and a legend, using a built-in 5x7 pixel font, and writes an RGB PNG. It is deliberately
small: enough for "GB/s against block size", not a plotting library.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Series", "line_plot", "encode_png"]

Color = tuple[int, int, int]

PALETTE: tuple[Color, ...] = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (23, 190, 207),
    (127, 127, 127),
)

# 5x7 glyphs: 7 rows of 5 pixels ("#" = ink). Lowercase letters render as uppercase.
_FONT: dict[str, tuple[str, ...]] = {
    '0': (' ### ', '#   #', '#  ##', '# # #', '##  #', '#   #', ' ### '),
    '1': ('  #  ', ' ##  ', '  #  ', '  #  ', '  #  ', '  #  ', ' ### '),
    '2': (' ### ', '#   #', '    #', '   # ', '  #  ', ' #   ', '#####'),
    '3': ('#####', '   # ', '  #  ', '   # ', '    #', '#   #', ' ### '),
    '4': ('   # ', '  ## ', ' # # ', '#  # ', '#####', '   # ', '   # '),
    '5': ('#####', '#    ', '#### ', '    #', '    #', '#   #', ' ### '),
    '6': ('  ## ', ' #   ', '#    ', '#### ', '#   #', '#   #', ' ### '),
    '7': ('#####', '    #', '   # ', '  #  ', ' #   ', ' #   ', ' #   '),
    '8': (' ### ', '#   #', '#   #', ' ### ', '#   #', '#   #', ' ### '),
    '9': (' ### ', '#   #', '#   #', ' ####', '    #', '   # ', ' ##  '),
    'A': (' ### ', '#   #', '#   #', '#####', '#   #', '#   #', '#   #'),
    'B': ('#### ', '#   #', '#   #', '#### ', '#   #', '#   #', '#### '),
    'C': (' ### ', '#   #', '#    ', '#    ', '#    ', '#   #', ' ### '),
    'D': ('###  ', '#  # ', '#   #', '#   #', '#   #', '#  # ', '###  '),
    'E': ('#####', '#    ', '#    ', '#### ', '#    ', '#    ', '#####'),
    'F': ('#####', '#    ', '#    ', '#### ', '#    ', '#    ', '#    '),
    'G': (' ### ', '#   #', '#    ', '# ###', '#   #', '#   #', ' ####'),
    'H': ('#   #', '#   #', '#   #', '#####', '#   #', '#   #', '#   #'),
    'I': (' ### ', '  #  ', '  #  ', '  #  ', '  #  ', '  #  ', ' ### '),
    'J': ('  ###', '   # ', '   # ', '   # ', '   # ', '#  # ', ' ##  '),
    'K': ('#   #', '#  # ', '# #  ', '##   ', '# #  ', '#  # ', '#   #'),
    'L': ('#    ', '#    ', '#    ', '#    ', '#    ', '#    ', '#####'),
    'M': ('#   #', '## ##', '# # #', '# # #', '#   #', '#   #', '#   #'),
    'N': ('#   #', '#   #', '##  #', '# # #', '#  ##', '#   #', '#   #'),
    'O': (' ### ', '#   #', '#   #', '#   #', '#   #', '#   #', ' ### '),
    'P': ('#### ', '#   #', '#   #', '#### ', '#    ', '#    ', '#    '),
    'Q': (' ### ', '#   #', '#   #', '#   #', '# # #', '#  # ', ' ## #'),
    'R': ('#### ', '#   #', '#   #', '#### ', '# #  ', '#  # ', '#   #'),
    'S': (' ####', '#    ', '#    ', ' ### ', '    #', '    #', '#### '),
    'T': ('#####', '  #  ', '  #  ', '  #  ', '  #  ', '  #  ', '  #  '),
    'U': ('#   #', '#   #', '#   #', '#   #', '#   #', '#   #', ' ### '),
    'V': ('#   #', '#   #', '#   #', '#   #', '#   #', ' # # ', '  #  '),
    'W': ('#   #', '#   #', '#   #', '# # #', '# # #', '# # #', ' # # '),
    'X': ('#   #', '#   #', ' # # ', '  #  ', ' # # ', '#   #', '#   #'),
    'Y': ('#   #', '#   #', ' # # ', '  #  ', '  #  ', '  #  ', '  #  '),
    'Z': ('#####', '    #', '   # ', '  #  ', ' #   ', '#    ', '#####'),
    ' ': ('     ', '     ', '     ', '     ', '     ', '     ', '     '),
    '.': ('     ', '     ', '     ', '     ', '     ', '     ', '  #  '),
    ',': ('     ', '     ', '     ', '     ', '     ', '  #  ', ' #   '),
    ':': ('     ', '  #  ', '  #  ', '     ', '  #  ', '  #  ', '     '),
    '-': ('     ', '     ', '     ', '#####', '     ', '     ', '     '),
    '+': ('     ', '  #  ', '  #  ', '#####', '  #  ', '  #  ', '     '),
    '/': ('    #', '    #', '   # ', '  #  ', ' #   ', '#    ', '#    '),
    '(': ('   # ', '  #  ', ' #   ', ' #   ', ' #   ', '  #  ', '   # '),
    ')': (' #   ', '  #  ', '   # ', '   # ', '   # ', '  #  ', ' #   '),
    '>': (' #   ', '  #  ', '   # ', '    #', '   # ', '  #  ', ' #   '),
    '<': ('   # ', '  #  ', ' #   ', '#    ', ' #   ', '  #  ', '   # '),
    '=': ('     ', '     ', '#####', '     ', '#####', '     ', '     '),
    '%': ('##   ', '##  #', '   # ', '  #  ', ' #   ', '#  ##', '   ##'),
    '_': ('     ', '     ', '     ', '     ', '     ', '     ', '#####'),
    'x': ('     ', '     ', '#   #', ' # # ', '  #  ', ' # # ', '#   #'),
}
_GLYPH_W, _GLYPH_H = 5, 7


@dataclass(frozen=True)
class Series:
    """One line: its legend label and its (x, y) points (x > 0: the x axis is log2)."""

    label: str
    points: Sequence[tuple[float, float]]


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i : i + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color, thick: int = 1) -> None:
        # Bresenham, stamped `thick` pixels wide.
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            for ox in range(thick):
                for oy in range(thick):
                    self.dot(x0 + ox - thick // 2, y0 + oy - thick // 2, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        for y in range(y0, y1):
            for x in range(x0, x1):
                self.dot(x, y, color)

    def text(self, x: int, y: int, text: str, color: Color = (0, 0, 0)) -> None:
        for ch in text:
            glyph = _FONT.get(ch) or _FONT.get(ch.upper()) or _FONT["_"]
            for row, bits in enumerate(glyph):
                for col, bit in enumerate(bits):
                    if bit == "#":
                        self.dot(x + col, y + row, color)
            x += _GLYPH_W + 1


def text_width(text: str) -> int:
    return len(text) * (_GLYPH_W + 1)


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """Encode 8-bit RGB pixels (row-major, `width * height * 3` bytes) as a PNG file."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    stride = width * 3
    # Filter type 0 (None) before every scanline.
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _format_bytes(value: float) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= size:
            return f"{value / size:g}{unit}"
    return f"{value:g}"


def line_plot(
    path: str | Path,
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 900,
    height: int = 540,
) -> Path:
    """Draw `series` (log2 x axis labelled as byte sizes, linear y from 0) and write a PNG.

    Returns:
        The path written.
    """
    canvas = _Canvas(width, height)
    left, right, top, bottom = 70, width - 230, 40, height - 50
    xs = [x for s in series for x, _ in s.points if x > 0]
    ys = [y for s in series for _, y in s.points]
    x_min, x_max = (math.log2(min(xs)), math.log2(max(xs))) if xs else (0.0, 1.0)
    if x_max == x_min:
        x_max = x_min + 1
    y_step = _nice_step(max(ys, default=1.0) or 1.0, 6)
    y_max = y_step * math.ceil((max(ys, default=1.0) or 1.0) / y_step)

    def px(x: float) -> int:
        return left + round((math.log2(x) - x_min) / (x_max - x_min) * (right - left))

    def py(y: float) -> int:
        return bottom - round(y / y_max * (bottom - top))

    grid, axis = (225, 225, 225), (0, 0, 0)
    tick = 0.0
    while tick <= y_max + 1e-9:
        canvas.line(left, py(tick), right, py(tick), grid)
        label = f"{tick:g}"
        canvas.text(left - 6 - text_width(label), py(tick) - 3, label)
        tick += y_step
    for exponent in range(math.ceil(x_min), math.floor(x_max) + 1, 2 if x_max - x_min > 8 else 1):
        x = 2.0**exponent
        canvas.line(px(x), top, px(x), bottom, grid)
        label = _format_bytes(x)
        canvas.text(px(x) - text_width(label) // 2, bottom + 8, label)
    canvas.line(left, top, left, bottom, axis)
    canvas.line(left, bottom, right, bottom, axis)
    canvas.text((left + right - text_width(title)) // 2, 14, title)
    canvas.text((left + right - text_width(x_label)) // 2, bottom + 26, x_label)
    canvas.text(8, top - 20, y_label)

    for index, s in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        points = sorted((px(x), py(y)) for x, y in s.points if x > 0)
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            canvas.line(x0, y0, x1, y1, color, thick=2)
        for x, y in points:
            canvas.rect(x - 2, y - 2, x + 3, y + 3, color)
        legend_y = top + 6 + index * 16
        canvas.rect(right + 16, legend_y, right + 30, legend_y + 7, color)
        canvas.text(right + 36, legend_y, s.label)

    out = Path(path)
    out.write_bytes(encode_png(width, height, bytes(canvas.pixels)))
    return out
