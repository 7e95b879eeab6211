-- Edit predictions in a real headless Neovim against the scripted server, run by
-- tests/test_editor_nvim_next_edit.py:
--   ECHOLINE_TEST_FILE=... ECHOLINE_TEST_OUT=... ECHOLINE_TEST_CMD='<json list>' \
--     nvim --headless --clean -c 'luafile next_edit.lua'
-- Keys go through nvim_input and the main loop (a coroutine sleeps between steps), so the
-- autocmds fire as they do for a user: the edit, the pause, the drawn prediction, the
-- mapping that jumps and then applies it. Records what it saw in OUT (JSON), writes the
-- file, exits non-zero on any failure.
local env = vim.env
local here = vim.fs.dirname(vim.fs.normalize(debug.getinfo(1, 'S').source:sub(2)))
local plugin_root = vim.fs.dirname(here)
vim.opt.rtp:prepend(plugin_root)
vim.cmd('runtime plugin/echoline.lua')
local t = dofile(here .. '/harness.lua').new(env.ECHOLINE_TEST_OUT, 'next_edit')
local record = t.record
local sleep = t.sleep

local function wait(what, cond, ms)
  t.wait(what, cond, ms or 20000, 20)
end

local ne = require('echoline.next_edit')

--- The extmarks of the prediction: highlighted ranges and virtual text, 1-based rows.
local function drawn(b)
  local got = { struck = {}, virt = {}, hint = {} }
  for _, m in ipairs(vim.api.nvim_buf_get_extmarks(b, ne.ns, 0, -1, { details = true })) do
    local row, col, d = m[2], m[3], m[4]
    if d.hl_group == 'EcholineNextEditDelete' then
      local text = vim.api.nvim_buf_get_text(b, row, col, d.end_row, d.end_col, {})
      table.insert(got.struck, { row = row + 1, col = col, text = table.concat(text, '\n') })
    end
    for _, chunk in ipairs(d.virt_text or {}) do
      local where = d.virt_text_pos == 'eol' and got.hint or got.virt
      table.insert(where, { row = row + 1, col = col, text = chunk[1], hl = chunk[2] })
    end
  end
  return got
end

local function line(b, n)
  return vim.api.nvim_buf_get_lines(b, n - 1, n, false)[1]
end

local function last_is(b, what)
  return function()
    return ne.last[b] == what
  end
end

t.run(function()
  require('echoline').setup({
    cmd = vim.json.decode(env.ECHOLINE_TEST_CMD),
    cmd_env = { PYTHONPATH = env.ECHOLINE_TEST_PYTHONPATH },
    model = 'smollm2',
    ghost_text = false,
    inline_warm = false,
    next_edit = true, -- off by default
    next_edit_debounce_ms = tonumber(env.ECHOLINE_TEST_DEBOUNCE_MS or '150'),
    keymaps = { next_edit = '<M-n>', next_edit_dismiss = '<M-d>' },
  })
  vim.cmd('edit ' .. vim.fn.fnameescape(env.ECHOLINE_TEST_FILE))
  local b = vim.api.nvim_get_current_buf()
  wait('the client', function()
    local c = require('echoline').client(b)
    return c and c.initialized
  end)
  sleep(200)
  record.maps = {
    n = vim.fn.maparg('<M-n>', 'n', false, true).desc,
    i = vim.fn.maparg('<M-n>', 'i', false, true).desc,
    tab = vim.fn.maparg('<Tab>', 'i', false, true).desc or '',
  }

  -- A: an edit on line 17, a pause: the prediction on line 18 drawn; <M-n> jumps, <M-n> applies.
  vim.api.nvim_win_set_cursor(0, { 17, 4 })
  vim.api.nvim_input('ciwlogger.info<Esc>')
  wait('the prediction on line 18', last_is(b, 'shown'))
  record.a = { drawn = drawn(b), cursor = vim.api.nvim_win_get_cursor(0) }
  vim.api.nvim_input('<M-n>')
  wait('the jump', last_is(b, 'jumped'))
  record.a.jumped_to = vim.api.nvim_win_get_cursor(0)
  record.a.line18_after_jump = line(b, 18)
  vim.api.nvim_input('<M-n>')
  wait('the accept', last_is(b, 'accepted'))
  record.a.line18 = line(b, 18)
  record.a.cursor_after = vim.api.nvim_win_get_cursor(0)

  -- B: the prediction asked after the accept (line 13), dismissed with the dismiss key;
  -- <M-n> then falls through (nothing happens to the text).
  wait('the chained prediction', last_is(b, 'shown'))
  record.b = { drawn = drawn(b) }
  vim.api.nvim_input('<M-d>')
  wait('the dismissal', last_is(b, 'dismissed'))
  record.b.after = drawn(b)
  vim.api.nvim_input('<M-n>')
  sleep(300)
  record.b.line13 = line(b, 13)

  -- :EcholineNextEdit where no rule applies: nothing drawn.
  vim.cmd('EcholineNextEdit')
  wait('no prediction', last_is(b, 'none'))

  -- C: renaming fibonacci's def: the server answers for another version: never drawn.
  vim.api.nvim_win_set_cursor(0, { 5, 4 })
  vim.api.nvim_input('ciwfib<Esc>')
  wait('the stale answer', last_is(b, 'stale'))
  record.c = { drawn = drawn(b), shown = ne.get(b) ~= nil }

  -- D: :EcholineNextEdit at the end of line 2: an insertion at the cursor; one <M-n> applies it.
  -- In Insert mode at the end of the line (A), asked through <Cmd>, applied with the
  -- Insert-mode mapping.
  vim.api.nvim_win_set_cursor(0, { 2, 0 })
  vim.api.nvim_input('A<Cmd>EcholineNextEdit<CR>')
  wait('the insertion', last_is(b, 'shown'))
  record.d = { drawn = drawn(b), insertion = ne.get(b).insertion }
  vim.api.nvim_input('<M-n>')
  wait('the accept', last_is(b, 'accepted'))
  record.d.line2 = line(b, 2)

  -- E: the prediction asked after that accept (an insertion at the cursor) is shown; the
  -- buffer then changes before the key is handled (a plugin, a sync): the prediction
  -- names an older version and is not applied.
  wait('the chained insertion', last_is(b, 'shown'))
  record.e = { drawn = drawn(b) }
  vim.api.nvim_buf_set_lines(b, -1, -1, false, { '# appended' })
  record.e.accepted = require('echoline').next_edit_accept(b)
  record.e.last = ne.last[b]
  record.e.line2 = line(b, 2)

  -- F: the prediction asked after that change (line 1, the cursor on line 2) is
  -- dismissed by a cursor move away.
  wait('the prediction after the change', last_is(b, 'shown'))
  record.f = { drawn = drawn(b) }
  vim.api.nvim_input('<Down>')
  wait('the dismissal by a cursor move', last_is(b, 'dismissed'))
  record.f.after = drawn(b)
  vim.api.nvim_input('<Esc>')
  sleep(100)

  vim.cmd('write')
  record.ok = true
  t.save()
  vim.cmd('qa!')
end)
