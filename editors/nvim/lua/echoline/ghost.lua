-- Inline completion shown as ghost text. Neovim 0.12+ has a built-in client
-- (vim.lsp.inline_completion); on 0.10/0.11 this module requests
-- textDocument/inlineCompletion itself and draws the item with extmarks.
local config = require('echoline.config')
local compat = require('echoline.compat')

local M = {}

local ns = vim.api.nvim_create_namespace('echoline_ghost')
M.ns = ns

--- Shown suggestion per buffer: { row, col, text, suffix, range, tick, mark, line, kept }
--- (`line`: the cursor's line when it was drawn; `kept`: redrawn by typing through it).
M.current = {}
--- Inline suggestions on or off (:EcholineToggle); :EcholineSuggest asks even when off.
M.enabled = true
--- Buffers set up by attach() (for the built-in client on 0.12+).
local attached = {}
local pending = require('echoline.inflight').new()
local timers = require('echoline.debounce').new()

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
  pending:cancel(bufnr)
end

local function item_text(item)
  local t = item.insertText
  if type(t) == 'table' then
    t = t.value
  end
  return type(t) == 'string' and t or ''
end

--- Draw `text` at (row0, col) if it extends what is typed; returns the suggestion.
--- `range` (byte positions, 0-based rows) is what accepting the text replaces; nil:
--- the text is inserted at the cursor.
function M.show_text(bufnr, row0, col, text, range)
  local suffix = text
  if range then
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
    line = vim.api.nvim_buf_get_lines(bufnr, row0, row0 + 1, false)[1] or '',
  }
  M.current[bufnr] = cur
  return cur
end

--- Typing through the shown suggestion: when the text typed on the cursor's line since
--- it was drawn is the start of the suggestion (the text before and after it unchanged),
--- keep it on screen, its rest drawn at the new cursor, as the server answers the next
--- request at once with that same rest (docs/sidecar.md, "Typing through a suggestion").
--- True when it was kept (or is drawn there already); false: the typing departed from it.
function M.type_through(bufnr)
  local cur = M.current[bufnr]
  if not cur or vim.api.nvim_get_current_buf() ~= bufnr then
    return false
  end
  local c = vim.api.nvim_win_get_cursor(0)
  local row0, col = c[1] - 1, c[2]
  if row0 == cur.row and col == cur.col and cur.tick == vim.b[bufnr].changedtick then
    return true
  end
  if row0 ~= cur.row or col <= cur.col then
    return false
  end
  local line = vim.api.nvim_buf_get_lines(bufnr, row0, row0 + 1, false)[1] or ''
  local typed = line:sub(cur.col + 1, col)
  if line:sub(1, cur.col) ~= cur.line:sub(1, cur.col) or line:sub(col + 1) ~= cur.line:sub(cur.col + 1) then
    return false -- an edit elsewhere on the line (an auto-inserted pair, ...)
  end
  if #typed >= #cur.suffix or cur.suffix:sub(1, #typed) ~= typed then
    return false
  end
  local range = cur.range and vim.deepcopy(cur.range) or nil
  if range and range.erow == row0 then
    range.ecol = range.ecol + #typed -- the rest of the line moved right
  end
  local kept = M.show_text(bufnr, row0, col, cur.range and cur.text or cur.suffix:sub(#typed + 1), range)
  if kept then
    kept.kept = true
  end
  return kept ~= nil
end

--- Draw the LSP inline completion `item` at (row0, col); returns the suggestion.
function M.show(bufnr, row0, col, item, encoding)
  local range
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
  end
  return M.show_text(bufnr, row0, col, item_text(item), range)
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
  local enc = client.offset_encoding
  local params, row0, col = require('echoline.cursor').params(bufnr, enc)
  params.textDocument = { uri = params.textDocument.uri } -- a TextDocumentIdentifier here
  params.context = { triggerKind = opts.manual and 1 or 2 } -- Invoked = 1, Automatic = 2
  local tick = vim.b[bufnr].changedtick
  local ok, id = compat.request(client, 'textDocument/inlineCompletion', params, function(err, result)
    pending:done(bufnr)
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
    pending:set(bufnr, client, id)
  else
    done(nil)
  end
end

--- The part of `suffix` that accept_word (`word`) or accept_line (`line`) inserts.
function M.part(suffix, kind)
  if kind == 'line' then
    local first = suffix:match('^[^\n]*')
    if first ~= '' then
      return first
    end
    return suffix:match('^\n[^\n]*') -- at a line end: the line break and the next line
  end
  -- A word: leading blanks, then a run of word characters, or else of other
  -- non-blank characters (so `foo(bar)` goes foo, (, bar, )).
  return suffix:match('^%s*[%w_]+') or suffix:match('^%s*[^%w_%s]+') or suffix:match('^%s+') or suffix
end

--- Insert the shown suggestion, or its next word / rest of line (`kind`: 'word',
--- 'line'); the rest stays shown. False when no suggestion is shown.
function M.accept(bufnr, kind)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local cur = M.current[bufnr]
  if not cur or vim.b[bufnr].changedtick ~= cur.tick then
    M.clear(bufnr)
    return false
  end
  local part = kind and M.part(cur.suffix, kind) or cur.suffix
  if part == cur.suffix then
    kind = nil -- all of it
  end
  M.clear(bufnr)
  local srow, scol, erow, ecol, text
  if kind then
    srow, scol, erow, ecol, text = cur.row, cur.col, cur.row, cur.col, part
  elseif cur.range then
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
  if kind then
    -- Show the rest at the new cursor; the item's range moves with the inserted text.
    local range = cur.range and vim.deepcopy(cur.range) or nil
    if range and range.erow == cur.row and range.ecol >= cur.col then
      range.erow = end_row
      range.ecol = end_col + (range.ecol - cur.col)
    elseif range then
      range.erow = range.erow + #lines - 1
    end
    local rest = cur.range and cur.text or cur.suffix:sub(#part + 1)
    M.show_text(bufnr, end_row, end_col, rest, range)
  end
  return true
end

--- The suggestion shown in `bufnr`, if any (for tests and statuslines).
function M.get(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  return M.current[bufnr]
end

local function schedule(bufnr)
  timers:start(bufnr, config.options.debounce_ms, function()
    if M.enabled and vim.api.nvim_get_current_buf() == bufnr and vim.fn.mode():sub(1, 1) == 'i' then
      M.request(bufnr)
    end
  end)
end

local function termcodes(keys)
  return vim.api.nvim_replace_termcodes(keys, true, true, true)
end

local function is_ours(m)
  return type(m) == 'table' and type(m.desc) == 'string' and m.desc:sub(1, 10) == 'echoline: '
end

--- The global insert-mode mapping of `key` now (nil: none or ours).
local function global_map(key)
  local raw = termcodes(key)
  for _, m in ipairs(vim.api.nvim_get_keymap('i')) do
    if (m.lhsraw == raw or termcodes(m.lhs) == raw) and not is_ours(m) then
      return m
    end
  end
  return nil
end

--- Do what `key` would do without echoline's mapping: run the mapping `m` (a
--- mapping dict as maparg() returns it; a Lua callback, an <expr> mapping, a
--- plain rhs) or, without one, insert the key itself.
function M.fallthrough(key, m)
  local function feed(keys, remap)
    -- 'i': before whatever is already typed ahead, as if the key had done it.
    vim.api.nvim_feedkeys(keys, (remap and 'm' or 'n') .. 'i', false)
  end
  if type(m) ~= 'table' or (m.callback == nil and (m.rhs == nil or m.rhs == '')) then
    return feed(termcodes(key), false)
  end
  local remap = m.noremap ~= 1 and m.noremap ~= true
  local keys
  if m.callback then
    local r = m.callback()
    if not (m.expr == 1 or m.expr == true) or type(r) ~= 'string' then
      return
    end
    keys = termcodes(r)
  else
    local rhs = m.rhs:gsub('<[Ss][Ii][Dd]>', '<SNR>' .. tostring(m.sid or 0) .. '_')
    if m.expr == 1 or m.expr == true then
      local ok, r = pcall(vim.api.nvim_eval, rhs)
      if not ok or type(r) ~= 'string' then
        return
      end
      keys = r
    else
      keys = termcodes(rhs)
    end
  end
  -- A remappable rhs that contains the key itself would come back here forever.
  if remap and keys:find(termcodes(key), 1, true) then
    remap = false
  end
  feed(keys, remap)
end

--- Map `key` in insert mode for `bufnr`: `action()` runs, and when it returns false
--- (no suggestion shown) the key falls through to the mapping it had before.
function M.map_key(bufnr, key, action, desc)
  local prev = vim.api.nvim_buf_call(bufnr, function()
    return vim.fn.maparg(key, 'i', false, true)
  end)
  -- A buffer-local mapping is replaced by ours: keep it. A global one (or one made
  -- later, e.g. by a completion plugin set up after echoline) is looked up when the
  -- key is pressed.
  local local_prev = (type(prev) == 'table' and prev.buffer == 1 and not is_ours(prev)) and prev or nil
  vim.keymap.set('i', key, function()
    if not action() then
      M.fallthrough(key, local_prev or global_map(key))
    end
  end, { buffer = bufnr, desc = 'echoline: ' .. desc })
end

--- Turn inline suggestions on or off for every buffer (nil: flip). Returns the new state.
function M.set_enabled(on)
  if on == nil then
    on = not M.enabled
  end
  M.enabled = on
  for bufnr in pairs(attached) do
    if vim.api.nvim_buf_is_valid(bufnr) then
      if not on then
        cancel_pending(bufnr)
        M.clear(bufnr)
      end
      if builtin() then
        pcall(vim.lsp.inline_completion.enable, on, { bufnr = bufnr })
      end
    else
      attached[bufnr] = nil
    end
  end
  return on
end

--- Set up ghost text for a buffer the client attached to.
function M.attach(_, bufnr)
  local o = config.options
  if not o.ghost_text then
    return
  end
  attached[bufnr] = true
  local keys = o.keymaps or {}
  if builtin() then
    pcall(vim.lsp.inline_completion.enable, M.enabled, { bufnr = bufnr })
    if keys.accept then
      M.map_key(bufnr, keys.accept, function()
        return vim.lsp.inline_completion.get() == true
      end, 'accept inline suggestion')
    end
    return
  end
  local group = vim.api.nvim_create_augroup('echoline_ghost_' .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd('TextChangedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      local cur = M.current[bufnr]
      if cur and cur.tick == vim.b[bufnr].changedtick and not cur.kept then
        return -- our own partial accept: the rest is shown already
      end
      if not M.type_through(bufnr) then
        M.clear(bufnr)
      end
      cur = M.current[bufnr]
      if cur then
        cur.kept = nil
      end
      if o.auto_trigger and M.enabled then
        schedule(bufnr) -- kept or not: the server answers a kept one's rest at once
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
        -- (CursorMovedI comes before TextChangedI: a keystroke typed through it keeps it)
        if (c[1] - 1 ~= cur.row or c[2] ~= cur.col) and not M.type_through(bufnr) then
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
      attached[bufnr] = nil
      timers:close(bufnr)
    end,
  })
  if keys.accept then
    M.map_key(bufnr, keys.accept, function()
      return M.accept(bufnr)
    end, 'accept inline suggestion')
  end
  if keys.accept_word then
    M.map_key(bufnr, keys.accept_word, function()
      return M.accept(bufnr, 'word')
    end, 'accept the next word of the inline suggestion')
  end
  if keys.accept_line then
    M.map_key(bufnr, keys.accept_line, function()
      return M.accept(bufnr, 'line')
    end, 'accept the current line of the inline suggestion')
  end
  if keys.dismiss then
    M.map_key(bufnr, keys.dismiss, function()
      local shown = M.current[bufnr] ~= nil or pending:has(bufnr)
      cancel_pending(bufnr)
      M.clear(bufnr)
      return shown
    end, 'dismiss inline suggestion')
  end
end

return M
