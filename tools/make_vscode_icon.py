"""Draw the VS Code extension's icon (editors/vscode/media/icon.png), with no image library.

What it shows is what the extension does: lines of code on a dark editor, the last one
typed up to a cursor and continued in dim "ghost" text — the suggestion echoline offers.
Drawn from rectangles on a 128x128 RGBA canvas and written as a PNG with zlib, so the
picture is reproducible from this file alone: ``python -m tools.make_vscode_icon``.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

SIZE = 128
OUT = Path(__file__).resolve().parents[1] / "editors" / "vscode" / "media" / "icon.png"

BACKGROUND = (30, 32, 44, 255)
CODE = (205, 214, 244, 255)
KEYWORD = (137, 180, 250, 255)
GHOST = (148, 226, 213, 110)
CURSOR = (249, 226, 175, 255)


def _inside_rounded(x: int, y: int, radius: int) -> bool:
    """Whether pixel (x, y) lies in the canvas's rounded square."""
    cx = min(max(x, radius), SIZE - 1 - radius)
    cy = min(max(y, radius), SIZE - 1 - radius)
    return (x - cx) ** 2 + (y - cy) ** 2 <= radius**2


def draw() -> list[list[tuple[int, int, int, int]]]:
    img = [[(0, 0, 0, 0)] * SIZE for _ in range(SIZE)]
    for y in range(SIZE):
        for x in range(SIZE):
            if _inside_rounded(x, y, 22):
                img[y][x] = BACKGROUND

    def bar(x0: int, y0: int, width: int, color: tuple[int, int, int, int], height: int = 8) -> None:
        for y in range(y0, y0 + height):
            for x in range(x0, x0 + width):
                img[y][x] = color

    # Three lines of code (indented like a function body), then the line being typed.
    bar(20, 24, 22, KEYWORD)
    bar(46, 24, 46, CODE)
    bar(32, 42, 58, CODE)
    bar(32, 60, 30, KEYWORD)
    bar(66, 60, 34, CODE)
    bar(32, 82, 26, CODE)
    bar(60, 78, 4, CURSOR, height=16)  # the cursor
    bar(68, 82, 40, GHOST)  # the suggestion, dim: not typed yet
    bar(32, 100, 52, GHOST)
    return img


def png(img: list[list[tuple[int, int, int, int]]]) -> bytes:
    raw = b"".join(b"\x00" + b"".join(struct.pack("4B", *px) for px in row) for row in img)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", SIZE, SIZE, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(png(draw()))
    print(OUT)


if __name__ == "__main__":
    main()
