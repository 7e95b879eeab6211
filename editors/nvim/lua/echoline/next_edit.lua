-- Edit predictions: after a pause following an edit (`next_edit_debounce_ms`), ask the
-- server for the next edit (`echoline/nextEdit`) and draw it where it would happen with
-- extmarks: the text it removes highlighted (EcholineNextEditDelete, struck through), the
-- text it adds as virtual text after it (EcholineNextEditAdd; further lines as virtual
-- lines), and, when the edit is on another line, a hint at the cursor. The
-- `keymaps.next_edit` key (or :EcholineNextEditAccept) moves the cursor to the edit, then
-- applies it. Any edit or a cursor move away dismisses it.
--
-- A prediction belongs to the buffer version it was computed for (the LSP version
-- Neovim sent): it is drawn only while the buffer is at that version and applied only if
-- it still is; otherwise it is dropped, never applied.
local config = require('echoline.config')
local compat = require('echoline.compat')

local M = {}

local ns = vim.api.nvim_create_namespace('echoline_next_edit')
M.ns = ns
M.method = 'echoline/nextEdit'
local CONTENT_MODIFIED = -32801
local REQUEST_CANCELLED = -32800

--- Shown prediction per buffer: { version, edits = { {srow, scol, erow, ecol, text} },
--- id, anchor = {row0, col}, jumped, insertion }.
M.current = {}
--- What happened last per buffer ('shown', 'none', 'stale', 'error: …', 'jumped',
--- 'accepted', 'dismissed'), for tests and :checkhealth.
M.last = {}
local pending = require('echoline.inflight').new()
local timers = require('echoline.debounce').new()
local busy = {} -- bufnr → true while the plugin itself edits or moves the cursor

local function define_highlights()
  local del = vim.api.nvim_get_hl(0, { name = 'DiffDelete', link = false })
  vim.api.nvim_set_hl(0, 'EcholineNextEditDelete', { default = true, strikethrough = true, bg = del.bg, fg = del.fg })
  vim.api.nvim_set_hl(0, 'EcholineNextEditAdd', { default = true, link = 'DiffAdd' })
  vim.api.nvim_set_hl(0, 'EcholineNextEditGhost', { default = true, link = 'Comment' })
  vim.api.nvim_set_hl(0, 'EcholineNextEditHint', { default = true, link = 'Comment' })
end
define_highlights()
vim.api.nvim_create_autocmd('ColorScheme', { callback = define_highlights })

local function buf(bufnr)
  return (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
end

local function note(bufnr, what)
  M.last[bufnr] = what
end

--- Remove the shown prediction of `bufnr` (`why` is kept in M.last when given).
function M.dismiss(bufnr, why)
  bufnr = buf(bufnr)
  local shown = M.current[bufnr] ~= nil
  M.current[bufnr] = nil
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  end
  if shown and why then
    note(bufnr, why)
  end
  return shown
end

local function cancel_pending(bufnr)
  pending:cancel(bufnr)
  timers:stop(bufnr)
end

--- Byte positions of an LSP range in `bufnr`.
local function to_bytes(bufnr, range, encoding)
  local s, e = range.start, range['end']
  local sline = vim.api.nvim_buf_get_lines(bufnr, s.line, s.line + 1, false)[1] or ''
  local eline = vim.api.nvim_buf_get_lines(bufnr, e.line, e.line + 1, false)[1] or ''
  return s.line, compat.byte_col(sline, s.character, encoding), e.line, compat.byte_col(eline, e.character, encoding)
end

local function key_name()
  local k = (config.options.keymaps or {}).next_edit
  return k or ':EcholineNextEditAccept'
end

--- Draw `pred` in `bufnr`.
local function draw(bufnr, pred)
  vim.api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  for _, e in ipairs(pred.edits) do
    if e.srow ~= e.erow or e.scol ~= e.ecol then
      vim.api.nvim_buf_set_extmark(bufnr, ns, e.srow, e.scol, {
        end_row = e.erow,
        end_col = e.ecol,
        hl_group = 'EcholineNextEditDelete',
        priority = 200,
      })
    end
    if e.text ~= '' then
      local lines = vim.split(e.text, '\n', { plain = true })
      local hl = pred.insertion and 'EcholineNextEditGhost' or 'EcholineNextEditAdd'
      local virt_lines = {}
      for i = 2, #lines do
        virt_lines[#virt_lines + 1] = { { lines[i], hl } }
      end
      vim.api.nvim_buf_set_extmark(bufnr, ns, e.erow, e.ecol, {
        virt_text = { { lines[1], hl } },
        virt_text_pos = 'inline',
        virt_lines = #virt_lines > 0 and virt_lines or nil,
        hl_mode = 'combine',
        priority = 200,
      })
    end
  end
  local first = pred.edits[1]
  if first.srow ~= pred.anchor[1] and not pred.jumped then
    vim.api.nvim_buf_set_extmark(bufnr, ns, pred.anchor[1], 0, {
      virt_text = { { string.format('⇥ %s: edit at line %d', key_name(), first.srow + 1), 'EcholineNextEditHint' } },
      virt_text_pos = 'eol',
    })
  end
end

--- Ask for a prediction at the cursor of the current window now (:EcholineNextEdit).
---@param opts? { on_result?: fun(pred: table?, what: string) }
function M.request(bufnr, opts)
  opts = opts or {}
  bufnr = buf(bufnr)
  local done = opts.on_result or function() end
  local client = require('echoline.client').get(bufnr)
  if not client then
    note(bufnr, 'error: no client')
    return done(nil, 'error: no client')
  end
  cancel_pending(bufnr)
  M.dismiss(bufnr)
  local enc = client.offset_encoding
  local params, row0, col = require('echoline.cursor').params(bufnr, enc)
  local version = params.textDocument.version
  local ok, id
  ok, id = compat.request(client, M.method, params, function(err, result)
    pending:done(bufnr, id)
    if not vim.api.nvim_buf_is_valid(bufnr) then
      return done(nil, 'gone')
    end
    if err then
      if err.code == REQUEST_CANCELLED then
        return done(nil, 'cancelled')
      end
      local what = err.code == CONTENT_MODIFIED and 'stale' or ('error: ' .. tostring(err.message))
      note(bufnr, what)
      return done(nil, what)
    end
    local edits = type(result) == 'table' and result.edits or {}
    if type(edits) ~= 'table' or #edits == 0 then
      note(bufnr, 'none')
      return done(nil, 'none')
    end
    local answered = type(result.textDocument) == 'table' and result.textDocument.version or nil
    -- Drawn only for the version it was computed for, while the buffer is still there.
    if answered ~= version or compat.buf_version(bufnr) ~= version then
      note(bufnr, 'stale')
      return done(nil, 'stale')
    end
    local pred = { version = version, edits = {}, id = result.id, anchor = { row0, col }, jumped = false }
    for _, e in ipairs(edits) do
      local srow, scol, erow, ecol = to_bytes(bufnr, e.range, enc)
      pred.edits[#pred.edits + 1] = { srow = srow, scol = scol, erow = erow, ecol = ecol, text = e.newText or '' }
    end
    table.sort(pred.edits, function(a, b)
      return a.srow < b.srow or (a.srow == b.srow and a.scol < b.scol)
    end)
    local f = pred.edits[1]
    pred.insertion = #pred.edits == 1 and f.srow == f.erow and f.scol == f.ecol and f.srow == row0 and f.scol == col
    M.current[bufnr] = pred
    draw(bufnr, pred)
    note(bufnr, 'shown')
    done(pred, 'shown')
  end, bufnr)
  if ok then
    pending:set(bufnr, client, id)
  else
    note(bufnr, 'error: not sent')
    done(nil, 'error: not sent')
  end
end

local function inside(e, row0, col)
  local after_start = row0 > e.srow or (row0 == e.srow and col >= e.scol)
  local before_end = row0 < e.erow or (row0 == e.erow and col <= e.ecol)
  return after_start and before_end
end

--- Move to the shown edit, or apply it when the cursor is on it. False when nothing is
--- shown (a mapping then falls through to what the key did before).
function M.jump_or_accept(bufnr)
  bufnr = buf(bufnr)
  local pred = M.current[bufnr]
  if not pred then
    return false
  end
  if compat.buf_version(bufnr) ~= pred.version then
    M.dismiss(bufnr, 'stale')
    return true
  end
  local first = pred.edits[1]
  local cur = vim.api.nvim_win_get_cursor(0)
  if not pred.jumped and not inside(first, cur[1] - 1, cur[2]) then
    busy[bufnr] = true
    pcall(vim.api.nvim_win_set_cursor, 0, { first.srow + 1, first.scol })
    busy[bufnr] = nil
    pred.jumped = true
    draw(bufnr, pred) -- without the hint
    note(bufnr, 'jumped')
    return true
  end
  -- Apply from the last edit back, so the positions of the earlier ones stay valid; an
  -- extmark follows the last edit's start through the earlier ones.
  local last = pred.edits[#pred.edits]
  local mark = vim.api.nvim_buf_set_extmark(bufnr, ns, last.srow, last.scol, { right_gravity = false })
  busy[bufnr] = true
  local ok, err = pcall(function()
    for i = #pred.edits, 1, -1 do
      local e = pred.edits[i]
      vim.api.nvim_buf_set_text(bufnr, e.srow, e.scol, e.erow, e.ecol, vim.split(e.text, '\n', { plain = true }))
    end
  end)
  local pos = vim.api.nvim_buf_get_extmark_by_id(bufnr, ns, mark, {})
  M.dismiss(bufnr)
  busy[bufnr] = nil
  if not ok then
    note(bufnr, 'error: ' .. tostring(err))
    return true
  end
  local lines = vim.split(last.text, '\n', { plain = true })
  local row = pos[1] + #lines - 1
  local col = #lines == 1 and pos[2] + #lines[1] or #lines[#lines]
  if vim.api.nvim_get_current_buf() == bufnr then
    pcall(vim.api.nvim_win_set_cursor, 0, { row + 1, col })
  end
  note(bufnr, 'accepted')
  return true
end

--- The prediction shown in `bufnr`, if any.
function M.get(bufnr)
  return M.current[buf(bufnr)]
end

local function schedule(bufnr)
  timers:start(bufnr, config.options.next_edit_debounce_ms or 150, function()
    if vim.api.nvim_buf_is_valid(bufnr) and vim.api.nvim_get_current_buf() == bufnr and config.options.next_edit then
      M.request(bufnr)
    end
  end)
end

--- An edit in `bufnr` (TextChanged/TextChangedI): dismiss, ask again after the pause.
function M.on_change(bufnr)
  M.dismiss(bufnr, 'dismissed')
  cancel_pending(bufnr)
  if config.options.next_edit then
    schedule(bufnr)
  end
end

--- The cursor moved: dismiss unless it is where it was asked or on the edit.
function M.on_cursor(bufnr)
  local pred = M.current[bufnr]
  if not pred or busy[bufnr] then
    return
  end
  local c = vim.api.nvim_win_get_cursor(0)
  local row0, col = c[1] - 1, c[2]
  if (row0 == pred.anchor[1] and col == pred.anchor[2]) or inside(pred.edits[1], row0, col) then
    return
  end
  M.dismiss(bufnr, 'dismissed')
end

--- Set up edit predictions for a buffer the client attached to.
function M.attach(_, bufnr)
  local o = config.options
  local group = vim.api.nvim_create_augroup('echoline_next_edit_' .. bufnr, { clear = true })
  local tick = vim.b[bufnr].changedtick
  vim.api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI', 'TextChangedP' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      local now = vim.b[bufnr].changedtick
      if now == tick then
        return
      end
      tick = now
      M.on_change(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd({ 'CursorMoved', 'CursorMovedI' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.on_cursor(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      cancel_pending(bufnr)
      M.dismiss(bufnr, 'dismissed')
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufUnload', 'LspDetach' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      cancel_pending(bufnr)
      M.current[bufnr] = nil
      timers:close(bufnr)
    end,
  })
  local keys = o.keymaps or {}
  if keys.next_edit then
    local ghost = require('echoline.ghost')
    -- Insert mode: with nothing shown the key does what it did before (its own mapping,
    -- e.g. <Tab> of a completion plugin, or the key itself).
    ghost.map_key(bufnr, keys.next_edit, function()
      return M.jump_or_accept(bufnr)
    end, 'jump to or accept the predicted edit')
    vim.keymap.set('n', keys.next_edit, function()
      if not M.jump_or_accept(bufnr) then
        vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(keys.next_edit, true, true, true), 'n', false)
      end
    end, { buffer = bufnr, desc = 'echoline: jump to or accept the predicted edit' })
  end
  if keys.next_edit_dismiss then
    vim.keymap.set('n', keys.next_edit_dismiss, function()
      if not M.dismiss(bufnr, 'dismissed') then
        vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(keys.next_edit_dismiss, true, true, true), 'n', false)
      end
    end, { buffer = bufnr, desc = 'echoline: dismiss the predicted edit' })
  end
end

return M
