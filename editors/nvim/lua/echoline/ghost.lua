-- Inline completion shown as ghost text. Neovim 0.12+ has a built-in client
-- (vim.lsp.inline_completion); on 0.10/0.11 this module requests
-- textDocument/inlineCompletion itself and draws the item with extmarks.
local config = require('echoline.config')
local compat = require('echoline.compat')

local M = {}

local ns = vim.api.nvim_create_namespace('echoline_ghost')
M.ns = ns

--- Shown suggestion per buffer: { row, col, text, suffix, range, tick, mark }.
M.current = {}
local pending = {} -- bufnr → { client, id }
local timers = {} -- bufnr → uv timer

vim.api.nvim_set_hl(0, 'EcholineGhost', { link = 'Comment', default = true })

local function builtin()
  return compat.has_012 and vim.lsp.inline_completion ~= nil
end

function M.clear(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  M.current[bufnr] = nil
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  end
end

local function cancel_pending(bufnr)
  local p = pending[bufnr]
  if p then
    pending[bufnr] = nil
    pcall(compat.cancel, p.client, p.id)
  end
end

local function item_text(item)
  local t = item.insertText
  if type(t) == 'table' then
    t = t.value
  end
  return type(t) == 'string' and t or ''
end

--- Draw `item` at (row0, col) if it extends what is typed; returns the suggestion.
function M.show(bufnr, row0, col, item, encoding)
  local text = item_text(item)
  local suffix, range = text, nil
  if type(item.range) == 'table' then
    local s, e = item.range.start, item.range['end']
    local sline = vim.api.nvim_buf_get_lines(bufnr, s.line, s.line + 1, false)[1] or ''
    local eline = vim.api.nvim_buf_get_lines(bufnr, e.line, e.line + 1, false)[1] or ''
    range = {
      srow = s.line,
      scol = compat.byte_col(sline, s.character, encoding),
      erow = e.line,
      ecol = compat.byte_col(eline, e.character, encoding),
    }
    -- Only a suggestion that continues the typed text can be drawn as ghost text.
    if range.srow > row0 or (range.srow == row0 and range.scol > col) then
      return nil
    end
    local typed = table.concat(vim.api.nvim_buf_get_text(bufnr, range.srow, range.scol, row0, col, {}), '\n')
    if text:sub(1, #typed) ~= typed then
      return nil
    end
    suffix = text:sub(#typed + 1)
  end
  if suffix == '' then
    return nil
  end
  M.clear(bufnr)
  local lines = vim.split(suffix, '\n', { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], 'EcholineGhost' } }
  end
  local mark = vim.api.nvim_buf_set_extmark(bufnr, ns, row0, col, {
    virt_text = { { lines[1], 'EcholineGhost' } },
    virt_text_pos = 'inline',
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = 'combine',
  })
  local cur = {
    row = row0,
    col = col,
    text = text,
    suffix = suffix,
    range = range,
    tick = vim.b[bufnr].changedtick,
    mark = mark,
  }
  M.current[bufnr] = cur
  return cur
end

--- Ask the server for an inline completion at the cursor of the current window.
---@param opts? { manual?: boolean, on_result?: fun(suggestion: table?) }
function M.request(bufnr, opts)
  opts = opts or {}
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local done = opts.on_result or function() end
  local client = require('echoline.client').get(bufnr)
  if not client then
    return done(nil)
  end
  cancel_pending(bufnr)
  local cursor = vim.api.nvim_win_get_cursor(0)
  local row0, col = cursor[1] - 1, cursor[2]
  local line = vim.api.nvim_buf_get_lines(bufnr, row0, row0 + 1, false)[1] or ''
  col = math.min(col, #line)
  local enc = client.offset_encoding
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = row0, character = compat.char_col(line, col, enc) },
    context = { triggerKind = opts.manual and 1 or 2 }, -- Invoked = 1, Automatic = 2
  }
  local tick = vim.b[bufnr].changedtick
  local ok, id = compat.request(client, 'textDocument/inlineCompletion', params, function(err, result)
    pending[bufnr] = nil
    if err or not result or not vim.api.nvim_buf_is_valid(bufnr) then
      return done(nil)
    end
    -- Stale: the text changed while the server was thinking.
    if vim.b[bufnr].changedtick ~= tick then
      return done(nil)
    end
    local items = result.items or result
    local item = type(items) == 'table' and items[1] or nil
    if not item then
      return done(nil)
    end
    done(M.show(bufnr, row0, col, item, enc))
  end, bufnr)
  if ok then
    pending[bufnr] = { client = client, id = id }
  else
    done(nil)
  end
end

--- Insert the shown suggestion; false when there is none.
function M.accept(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local cur = M.current[bufnr]
  if not cur or vim.b[bufnr].changedtick ~= cur.tick then
    M.clear(bufnr)
    return false
  end
  M.clear(bufnr)
  local srow, scol, erow, ecol, text
  if cur.range then
    srow, scol, erow, ecol, text = cur.range.srow, cur.range.scol, cur.range.erow, cur.range.ecol, cur.text
  else
    srow, scol, erow, ecol, text = cur.row, cur.col, cur.row, cur.col, cur.suffix
  end
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, srow, scol, erow, ecol, lines)
  local end_row = srow + #lines - 1
  local end_col = #lines == 1 and scol + #lines[1] or #lines[#lines]
  if vim.api.nvim_get_current_buf() == bufnr then
    pcall(vim.api.nvim_win_set_cursor, 0, { end_row + 1, end_col })
  end
  return true
end

--- The suggestion shown in `bufnr`, if any (for tests and statuslines).
function M.get(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  return M.current[bufnr]
end

local function schedule(bufnr)
  local t = timers[bufnr]
  if not t then
    t = vim.uv.new_timer()
    timers[bufnr] = t
  end
  t:stop()
  t:start(config.options.debounce_ms, 0, vim.schedule_wrap(function()
    if vim.api.nvim_get_current_buf() == bufnr and vim.fn.mode():sub(1, 1) == 'i' then
      M.request(bufnr)
    end
  end))
end

local function map_accept(bufnr, key, accept)
  vim.keymap.set('i', key, function()
    if not accept() then
      vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(key, true, false, true), 'n', false)
    end
  end, { buffer = bufnr, desc = 'echoline: accept inline suggestion' })
end

--- Set up ghost text for a buffer the client attached to.
function M.attach(_, bufnr)
  local o = config.options
  if not o.ghost_text then
    return
  end
  if builtin() then
    pcall(vim.lsp.inline_completion.enable, true, { bufnr = bufnr })
    if o.keymaps.accept then
      map_accept(bufnr, o.keymaps.accept, function()
        return vim.lsp.inline_completion.get() == true
      end)
    end
    return
  end
  local group = vim.api.nvim_create_augroup('echoline_ghost_' .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd('TextChangedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      M.clear(bufnr)
      if o.auto_trigger then
        schedule(bufnr)
      end
    end,
  })
  vim.api.nvim_create_autocmd('CursorMovedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      local cur = M.current[bufnr]
      if cur then
        local c = vim.api.nvim_win_get_cursor(0)
        if c[1] - 1 ~= cur.row or c[2] ~= cur.col then
          M.clear(bufnr)
        end
      end
    end,
  })
  vim.api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      cancel_pending(bufnr)
      M.clear(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufUnload', 'LspDetach' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      cancel_pending(bufnr)
      if timers[bufnr] then
        timers[bufnr]:stop()
        timers[bufnr]:close()
        timers[bufnr] = nil
      end
    end,
  })
  if o.keymaps.accept then
    map_accept(bufnr, o.keymaps.accept, function()
      return M.accept(bufnr)
    end)
  end
  if o.keymaps.dismiss then
    vim.keymap.set('i', o.keymaps.dismiss, function()
      cancel_pending(bufnr)
      M.clear(bufnr)
    end, { buffer = bufnr, desc = 'echoline: dismiss inline suggestion' })
  end
end

return M
