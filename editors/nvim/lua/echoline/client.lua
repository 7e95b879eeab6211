-- Starting the language server and attaching buffers to it.
local config = require('echoline.config')
local status = require('echoline.status')
local compat = require('echoline.compat')

local M = {}

M.name = 'echoline'

--- Listeners for `echoline/rewriteProgress`, keyed by uri.
M.rewrite_listeners = {}

--- URIs whose rewrite was cancelled: a late workspace/applyEdit for them is refused.
M.refuse_edits = {}

local function on_status(_, params)
  params = params or {}
  status.update({
    state = params.state,
    model = params.model,
    message = params.message,
    tokS = params.tokS,
    acceptance = params.acceptance,
    exactness = params.exactness, -- engine 'openai': what the connect-time probe found
    models = params.models, -- job -> { model, reason, state }
    modelSummary = params.modelSummary, -- the same in one line
  })
  if params.state == 'error' then
    vim.schedule(function()
      vim.notify('echoline: ' .. tostring(params.message or 'server error'), vim.log.levels.ERROR)
    end)
  end
end

local function on_rewrite_progress(_, params)
  if type(params) ~= 'table' then
    return
  end
  local fn = M.rewrite_listeners[params.uri]
  if fn then
    fn(params)
  end
end

--- Like the default handler, but reports a stale edit as not applied
--- (the default prints "newer than edits" and still answers applied=true).
local function on_apply_edit(err, params, ctx)
  local edit = params and params.edit or {}
  for uri in pairs(edit.changes or {}) do
    if M.refuse_edits[uri] then
      return { applied = false, failureReason = 'the rewrite was cancelled' }
    end
  end
  for _, change in ipairs(edit.documentChanges or {}) do
    local td = change.textDocument
    if td and M.refuse_edits[td.uri] then
      return { applied = false, failureReason = 'the rewrite was cancelled' }
    end
    if td and td.version and td.version > 0 then
      local bufnr = vim.uri_to_bufnr(td.uri)
      if vim.api.nvim_buf_is_loaded(bufnr) and compat.buf_version(bufnr) > td.version then
        return { applied = false, failureReason = 'the buffer changed since the request' }
      end
    end
  end
  -- Without the label: the default handler would print it on every rewrite.
  local quiet = vim.deepcopy(params)
  quiet.label = nil
  return vim.lsp.handlers['workspace/applyEdit'](err, quiet, ctx)
end

local function root_dir(bufnr)
  local name = vim.api.nvim_buf_get_name(bufnr)
  local found = vim.fs.find(config.options.root_markers, { path = vim.fs.dirname(name), upward = true })[1]
  if found then
    return vim.fs.dirname(found)
  end
  return vim.fs.dirname(name) or vim.uv.cwd()
end

--- What both ways of starting the client share: command, settings, handlers, hooks.
function M.base_config(o)
  o = o or config.options
  local settings = config.server_settings(o)
  return {
    cmd = config.cmd(o),
    cmd_env = o.cmd_env,
    cmd_cwd = o.cmd_cwd,
    settings = { echoline = settings },
    handlers = {
      ['echoline/status'] = on_status,
      ['echoline/rewriteProgress'] = on_rewrite_progress,
      ['workspace/applyEdit'] = on_apply_edit,
      ['echoline/inlineWarm'] = function(err, params, ctx)
        return require('echoline.cursor').on_warm(err, params, ctx)
      end,
    },
    -- The server reads initializationOptions; they are the `settings.echoline` table
    -- as resolved at start (so vim.lsp.config() overrides of settings apply to both).
    before_init = function(params, cfg)
      local s = cfg.settings and cfg.settings.echoline
      if s then
        params.initializationOptions = s
      end
    end,
    on_init = function(client)
      local s = (client.config.settings or {}).echoline or settings
      -- Push the settings once too, for servers that read them from didChangeConfiguration.
      compat.notify(client, 'workspace/didChangeConfiguration', { settings = { echoline = s } })
      status.update({ state = status.state.state == 'idle' and 'loading' or status.state.state, model = s.model })
    end,
    on_exit = function(code)
      status.update({ state = code == 0 and 'idle' or 'error', message = 'server exited with code ' .. code })
    end,
    on_attach = function(client, b)
      require('echoline.ghost').attach(client, b)
      require('echoline.cursor').attach(b)
      require('echoline.next_edit').attach(client, b)
    end,
  }
end

--- The config of vim.lsp.start() for `bufnr` (setup()'s FileType autocmd).
function M.start_config(bufnr)
  local c = M.base_config()
  c.name = M.name
  c.root_dir = root_dir(bufnr)
  c.init_options = c.settings.echoline
  return c
end

--- The config table of lsp/echoline.lua, for vim.lsp.config() / vim.lsp.enable() (0.11+):
--- the same as start_config() with root_markers and filetypes instead of a root_dir.
function M.lsp_config()
  local o = config.options
  local c = M.base_config(o)
  c.root_markers = o.root_markers
  c.filetypes = (o.filetypes and #o.filetypes > 0) and o.filetypes or nil
  return c
end

--- Attach `bufnr` to the echoline server (starting it when needed).
---@return integer? client_id
function M.attach(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  if vim.bo[bufnr].buftype ~= '' or vim.api.nvim_buf_get_name(bufnr) == '' then
    return nil
  end
  return vim.lsp.start(M.start_config(bufnr), { bufnr = bufnr })
end

function M.get(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  return vim.lsp.get_clients({ name = M.name, bufnr = bufnr })[1]
end

return M
