-- Where the cursor rests, told to the server (`echoline/cursor`: the buffer's URI, its
-- LSP version, the position), so the server can run the inline prompt there before the
-- first keystroke: on a CPU the first completion at a new place would otherwise run the
-- whole prompt (docs/sidecar.md, "Inline warm-up"). Sent while inline suggestions are on
-- and `inline_warm` is set, once the cursor has stayed put `rest_ms`; the server then
-- waits its own `inlineWarmMs`.
local config = require('echoline.config')
local compat = require('echoline.compat')

local M = {}

M.rest_ms = 100
--- The server's last `echoline/inlineWarm` end notification (for :checkhealth and tests).
M.last_warm = nil

local timers = require('echoline.debounce').new()

local function enabled()
  local o = config.options
  return o.inline_warm and o.ghost_text and require('echoline.ghost').enabled
end

--- The notification's params for `bufnr`'s cursor in the current window (the
--- position requests at the cursor send too), then its row (0-based) and byte column
--- (within the line).
function M.params(bufnr, encoding)
  local cursor = vim.api.nvim_win_get_cursor(0)
  local row0 = cursor[1] - 1
  local line = vim.api.nvim_buf_get_lines(bufnr, row0, row0 + 1, false)[1] or ''
  local col = math.min(cursor[2], #line)
  return {
    textDocument = { uri = vim.uri_from_bufnr(bufnr), version = compat.buf_version(bufnr) },
    position = { line = row0, character = compat.char_col(line, col, encoding) },
  }, row0, col
end


--- Send `bufnr`'s cursor once it has rested `rest_ms` (a newer call restarts the wait).
function M.report(bufnr)
  if not enabled() then
    return
  end
  timers:start(bufnr, M.rest_ms, function()
    if not vim.api.nvim_buf_is_valid(bufnr) or vim.api.nvim_get_current_buf() ~= bufnr or not enabled() then
      return
    end
    local client = require('echoline.client').get(bufnr)
    if client then
      compat.notify(client, 'echoline/cursor', (M.params(bufnr, client.offset_encoding)))
    end
  end)
end

--- The server's `echoline/inlineWarm` (start and end of a warm-up): the end is kept.
function M.on_warm(_, params)
  if type(params) == 'table' and params.state ~= 'started' then
    M.last_warm = params
  end
end

--- Report the cursor of `bufnr` as it moves (the client attached to it).
function M.attach(bufnr)
  local group = vim.api.nvim_create_augroup('echoline_cursor_' .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd({ 'CursorMoved', 'CursorMovedI', 'BufEnter' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.report(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufUnload', 'LspDetach' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      timers:close(bufnr)
    end,
  })
  if vim.api.nvim_get_current_buf() == bufnr then
    M.report(bufnr)
  end
end

return M
