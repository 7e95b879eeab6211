-- :EcholineRewrite — rewrite a line range with an instruction. Preview mode shows
-- the proposal beside the original in a diff tab (accept: `a`/<CR>, reject: `q`);
-- with confirm=false the server applies the edit itself (workspace/applyEdit).
local config = require('echoline.config')
local status = require('echoline.status')
local compat = require('echoline.compat')
local client_mod = require('echoline.client')

local M = {}

--- Running rewrites: bufnr → { client, id, uri }.
M.running = {}

local RequestCancelled = -32800

--- LSP range covering whole lines l1..l2 (1-based, inclusive) of `bufnr`.
function M.line_range(bufnr, l1, l2, encoding)
  local n = vim.api.nvim_buf_line_count(bufnr)
  if l2 < n then
    return { start = { line = l1 - 1, character = 0 }, ['end'] = { line = l2, character = 0 } }
  end
  local last = vim.api.nvim_buf_get_lines(bufnr, n - 1, n, false)[1] or ''
  return {
    start = { line = l1 - 1, character = 0 },
    ['end'] = { line = n - 1, character = compat.char_col(last, #last, encoding) },
  }
end

local function finish(bufnr)
  M.running[bufnr] = nil
  status.update({ rewriting = false })
end

--- Show `result` (preview mode) in a diff tab; apply `result.edit` on accept.
local function preview(client, bufnr, l1, l2, result, stats, on_done)
  local orig = vim.api.nvim_buf_get_lines(bufnr, l1 - 1, l2, false)
  local text = result.text or ''
  local proposed = vim.split(text:gsub('\n$', ''), '\n', { plain = true })
  local ft = vim.bo[bufnr].filetype
  local tick = vim.b[bufnr].changedtick

  vim.cmd('tabnew')
  local tab = vim.api.nvim_get_current_tabpage()
  local function scratch(lines, name)
    local b = vim.api.nvim_get_current_buf()
    vim.bo[b].buftype = 'nofile'
    vim.bo[b].bufhidden = 'wipe'
    vim.bo[b].swapfile = false
    vim.api.nvim_buf_set_lines(b, 0, -1, false, lines)
    vim.bo[b].modifiable = false
    vim.bo[b].filetype = ft
    pcall(vim.api.nvim_buf_set_name, b, name)
    vim.cmd('diffthis')
    return b
  end
  local left = scratch(orig, string.format('echoline://original/%d', bufnr))
  vim.cmd('rightbelow vsplit | enew')
  local right = scratch(proposed, string.format('echoline://proposed/%d', bufnr))

  local closed = false
  local function close(accepted)
    if closed then
      return
    end
    closed = true
    if vim.api.nvim_tabpage_is_valid(tab) then
      vim.cmd('tabclose ' .. vim.api.nvim_tabpage_get_number(tab))
    end
    local applied, reason = false, nil
    if not accepted then
      reason = 'rejected'
    end
    if accepted then
      if vim.b[bufnr].changedtick ~= tick then
        reason = 'the buffer changed while previewing'
      elseif result.edit then
        vim.lsp.util.apply_workspace_edit(result.edit, client.offset_encoding)
        applied = true
      else
        vim.api.nvim_buf_set_lines(bufnr, l1 - 1, l2, false, proposed)
        applied = true
      end
    end
    on_done(applied, reason)
  end
  for _, b in ipairs({ left, right }) do
    for _, k in ipairs({ 'a', '<CR>' }) do
      vim.keymap.set('n', k, function() close(true) end, { buffer = b, desc = 'echoline: accept rewrite' })
    end
    for _, k in ipairs({ 'q', 'r', '<Esc>' }) do
      vim.keymap.set('n', k, function() close(false) end, { buffer = b, desc = 'echoline: reject rewrite' })
    end
    vim.api.nvim_create_autocmd('BufWipeout', { buffer = b, once = true, callback = function() close(false) end })
  end
  vim.api.nvim_echo({ { 'echoline: ' .. status.describe(stats) .. ' — a/<CR> accept, q reject', 'MoreMsg' } }, false, {})
end

---@class echoline.RewriteOpts
---@field bufnr? integer
---@field line1? integer
---@field line2? integer
---@field confirm? boolean
---@field on_done? fun(applied: boolean, reason: string?, result: table?)

--- Start a rewrite of lines line1..line2 with `instruction`. Asynchronous.
---@param instruction string
---@param opts? echoline.RewriteOpts
---@return integer? request_id
function M.rewrite(instruction, opts)
  opts = opts or {}
  local bufnr = (opts.bufnr == nil or opts.bufnr == 0) and vim.api.nvim_get_current_buf() or opts.bufnr
  local on_done = opts.on_done or function(applied, reason)
    if not applied and reason then
      vim.notify('echoline: rewrite not applied: ' .. reason, vim.log.levels.WARN)
    end
  end
  local client = client_mod.get(bufnr)
  if not client then
    vim.notify('echoline: no echoline client attached to this buffer (call setup())', vim.log.levels.ERROR)
    return nil
  end
  if M.running[bufnr] then
    M.cancel(bufnr)
  end
  local l1 = opts.line1 or vim.fn.line('.')
  local l2 = opts.line2 or l1
  local confirm = opts.confirm
  if confirm == nil then
    confirm = config.options.confirm
  end
  local uri = vim.uri_from_bufnr(bufnr)
  local token = string.format('echoline-rewrite-%d-%d', bufnr, vim.uv.hrtime())
  local args = {
    uri = uri,
    version = compat.buf_version(bufnr),
    range = M.line_range(bufnr, l1, l2, client.offset_encoding),
    instruction = instruction or '',
    mode = confirm and 'preview' or 'apply',
  }
  client_mod.rewrite_listeners[uri] = function(p)
    local st = status.read_stats(p)
    status.update({ rewriting = st })
    status.progress(status.describe(st))
  end
  status.update({ rewriting = {} })
  status.progress(string.format('rewriting lines %d-%d…', l1, l2))
  -- Neovim drops the callback when the server acknowledges a cancel, so cancel()
  -- finishes the rewrite itself and marks `run` so a late answer is ignored.
  local run = { client = client, uri = uri, on_done = on_done }
  client_mod.refuse_edits[uri] = nil
  local ok, id = compat.request(client, 'workspace/executeCommand', {
    command = 'echoline.rewrite',
    arguments = { args },
    workDoneToken = token,
  }, function(err, result)
    if run.cancelled then
      return
    end
    client_mod.rewrite_listeners[uri] = nil
    finish(bufnr)
    if err then
      local cancelled = err.code == RequestCancelled
      status.progress(cancelled and 'rewrite cancelled' or 'rewrite failed', cancelled and 'cancel' or 'failed')
      if not cancelled then
        vim.notify('echoline: rewrite failed: ' .. tostring(err.message), vim.log.levels.ERROR)
      end
      on_done(false, cancelled and 'cancelled' or tostring(err.message), nil)
      return
    end
    result = result or {}
    local stats = status.read_stats(result.stats)
    status.update({ tokS = stats.tokS, acceptance = stats.acceptance })
    status.progress('done: ' .. status.describe(stats), true)
    if confirm then
      preview(client, bufnr, l1, l2, result, stats, function(applied, reason)
        on_done(applied, reason, result)
      end)
    else
      on_done(result.applied == true, result.reason ~= vim.NIL and result.reason or nil, result)
    end
  end, bufnr)
  if not ok then
    client_mod.rewrite_listeners[uri] = nil
    finish(bufnr)
    vim.notify('echoline: could not send the rewrite request', vim.log.levels.ERROR)
    return nil
  end
  run.id = id
  M.running[bufnr] = run
  return id
end

--- Cancel the running rewrite of `bufnr` ($/cancelRequest).
function M.cancel(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local r = M.running[bufnr]
  if not r then
    return false
  end
  r.cancelled = true
  -- An edit the server sends after this point belongs to the cancelled rewrite.
  client_mod.refuse_edits[r.uri] = true
  compat.cancel(r.client, r.id)
  client_mod.rewrite_listeners[r.uri] = nil
  finish(bufnr)
  status.progress('rewrite cancelled', 'cancel')
  r.on_done(false, 'cancelled', nil)
  return true
end

return M
