-- echoline for Neovim: local inline completions (ghost text) and selection
-- rewrites from `echoline serve`, a Python language server.
--
--   require('echoline').setup({ cmd = { 'echoline', 'serve' }, filetypes = { 'python', 'lua' } })
--   :'<,'>EcholineRewrite add type hints
local config = require('echoline.config')

local M = {}

local group = vim.api.nvim_create_augroup('echoline', { clear = true })

--- Configure the plugin and attach to matching buffers (now and on FileType).
---@param opts? table see require('echoline.config').defaults
function M.setup(opts)
  local o = config.set(opts)
  vim.api.nvim_clear_autocmds({ group = group })
  if not o.autostart then
    return o -- started elsewhere, e.g. vim.lsp.enable('echoline') (lsp/echoline.lua)
  end
  local pattern = (o.filetypes and #o.filetypes > 0) and o.filetypes or '*'
  vim.api.nvim_create_autocmd('FileType', {
    group = group,
    pattern = pattern,
    callback = function(ev)
      require('echoline.client').attach(ev.buf)
    end,
  })
  -- Buffers opened before setup() was called.
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(b) and vim.bo[b].filetype ~= '' then
      local ft = vim.bo[b].filetype
      if pattern == '*' or vim.tbl_contains(pattern, ft) then
        require('echoline.client').attach(b)
      end
    end
  end
  return o
end

--- Attach a buffer explicitly (e.g. one without a filetype).
function M.attach(bufnr)
  return require('echoline.client').attach(bufnr)
end

function M.client(bufnr)
  return require('echoline.client').get(bufnr)
end

--- Rewrite lines with an instruction; see echoline.rewrite.rewrite for `opts`.
function M.rewrite(instruction, opts)
  return require('echoline.rewrite').rewrite(instruction, opts)
end

function M.cancel(bufnr)
  return require('echoline.rewrite').cancel(bufnr)
end

--- Request an inline suggestion at the cursor now (also the manual trigger).
function M.suggest(bufnr, opts)
  return require('echoline.ghost').request(bufnr, vim.tbl_extend('force', { manual = true }, opts or {}))
end

--- Accept the shown suggestion, or its next word / rest of line (`kind`: 'word', 'line').
function M.accept(bufnr, kind)
  return require('echoline.ghost').accept(bufnr, kind)
end

function M.dismiss(bufnr)
  return require('echoline.ghost').clear(bufnr)
end

function M.suggestion(bufnr)
  return require('echoline.ghost').get(bufnr)
end

--- Turn inline suggestions on (true), off (false) or over (nil); returns the new state.
function M.toggle(enable)
  return require('echoline.ghost').set_enabled(enable)
end

--- Ask for an instruction (vim.ui.input), then rewrite; `opts` as for rewrite().
--- Cancelling the prompt does nothing; an empty instruction lets the model tidy the lines.
function M.rewrite_prompt(opts)
  vim.ui.input({ prompt = 'echoline rewrite: ' }, function(input)
    if input == nil then
      return
    end
    M.rewrite(input, opts)
  end)
end

--- Ask for an edit prediction at the cursor now (:EcholineNextEdit); `opts.on_result`
--- gets the prediction (or nil) and what happened ('shown', 'none', 'stale', …).
function M.next_edit(bufnr, opts)
  return require('echoline.next_edit').request(bufnr, opts)
end

--- Jump to the predicted edit, or apply it when the cursor is on it; false: none shown.
function M.next_edit_accept(bufnr)
  return require('echoline.next_edit').jump_or_accept(bufnr)
end

function M.next_edit_dismiss(bufnr)
  return require('echoline.next_edit').dismiss(bufnr, 'dismissed')
end

--- For 'statusline': `set statusline+=%{v:lua.require'echoline'.statusline()}`.
function M.statusline()
  return require('echoline.status').statusline()
end

return M
