-- Server state for statuslines and progress messages.
local M = {}

M.state = { state = 'idle', model = nil, message = nil, tokS = nil, acceptance = nil, rewriting = nil }

local last_progress = 0

local function fmt_acceptance(a)
  if type(a) ~= 'number' then
    return nil
  end
  if a <= 1 then
    a = a * 100
  end
  return string.format('%d%%', math.floor(a + 0.5))
end

--- Read statistics whatever their spelling (camelCase or snake_case).
function M.read_stats(s)
  s = type(s) == 'table' and s or {}
  local function pick(...)
    for _, k in ipairs({ ... }) do
      if type(s[k]) == 'number' then
        return s[k]
      end
    end
  end
  return {
    tokens = pick('tokens', 'generated_tokens', 'generatedTokens', 'n_tokens'),
    tokS = pick('tokS', 'tokens_per_s', 'tok_s', 'tokensPerSecond', 'tokens_per_second'),
    acceptance = pick('acceptance', 'acceptanceRate', 'acceptance_rate'),
  }
end

function M.describe(stats)
  local parts = {}
  if stats.tokens then
    parts[#parts + 1] = string.format('%d tok', stats.tokens)
  end
  if stats.tokS then
    parts[#parts + 1] = string.format('%.1f tok/s', stats.tokS)
  end
  local acc = fmt_acceptance(stats.acceptance)
  if acc then
    parts[#parts + 1] = acc .. ' accepted'
  end
  return table.concat(parts, ', ')
end

function M.update(t)
  for k, v in pairs(t) do
    if v ~= vim.NIL then
      M.state[k] = v
    end
  end
  vim.schedule(function()
    vim.cmd('redrawstatus')
  end)
end

--- Whether the server's jobs (rewrite, inline) run on more than one model.
local function models_differ(models)
  local seen
  for _, m in pairs(type(models) == 'table' and models or {}) do
    local name = type(m) == 'table' and m.model or nil
    if seen and name ~= seen then
      return true
    end
    seen = seen or name
  end
  return false
end

--- A short string for 'statusline': `%{v:lua.require'echoline'.statusline()}`.
--- One model for every job: its name; one a job: the server's modelSummary.
function M.statusline()
  local s = M.state
  if s.state == 'idle' then
    return ''
  end
  local parts = { 'echoline' }
  if type(s.modelSummary) == 'string' and s.modelSummary ~= '' and models_differ(s.models) then
    parts[#parts + 1] = s.modelSummary
  elseif s.model then
    parts[#parts + 1] = s.model
  end
  if s.exactness then -- a shared inference server: 'verified' or 'best-effort' (docs/team.md)
    parts[#parts + 1] = 'remote ' .. s.exactness
  end
  local loading = s.state == 'loading' and type(s.message) == 'string' and s.message ~= ''
  if loading then
    -- What the load is doing (downloading, compiling kernels, calibrating), even while a
    -- rewrite waits for it.
    parts[#parts + 1] = 'loading (' .. s.message .. ')'
  elseif s.rewriting then
    parts[#parts + 1] = 'rewriting ' .. M.describe(s.rewriting)
  elseif s.state ~= 'ready' then
    parts[#parts + 1] = s.state
  else
    local st = M.describe({ tokS = s.tokS, acceptance = s.acceptance })
    if st ~= '' then
      parts[#parts + 1] = st
    end
  end
  if not require('echoline.ghost').enabled then
    parts[#parts + 1] = 'inline off'
  end
  return table.concat(parts, ' · ')
end

--- What :EcholineStatus shows: the statusline, then which model does which job (the
--- server's modelSummary), which the statusline names only when the jobs' models differ.
function M.report()
  local line = M.statusline()
  if line == '' then
    return 'echoline: not running'
  end
  local summary = M.state.modelSummary
  if type(summary) == 'string' and summary ~= '' then
    line = line .. '\nmodels: ' .. summary
  end
  return line
end

M.progress_interval_ms = 250
local progress_id = nil -- 0.12+: the id of the progress message being updated

--- Echo `msg` in the message area, replacing the previous line (not kept in
--- :messages). On 0.12+ a progress message (`kind = 'progress'`), updated in place.
--- `final`: nil while running, else true (done) or 'cancel' / 'failed'.
local function echo(msg, final)
  if require('echoline.compat').has_012 then
    local ok, id = pcall(vim.api.nvim_echo, { { msg } }, final ~= nil, {
      kind = 'progress',
      id = progress_id,
      title = 'echoline',
      status = final == nil and 'running' or (final == true and 'success' or final),
    })
    if ok then
      progress_id = not final and id or nil
      return
    end
  end
  -- One line, truncated to the screen so it never asks for "Press ENTER".
  local width = math.max(vim.o.columns - 12, 20)
  if vim.fn.strdisplaywidth(msg) > width then
    msg = vim.fn.strcharpart(msg, 0, width - 1) .. '…'
  end
  vim.api.nvim_echo({ { msg, final and 'MoreMsg' or 'Normal' } }, false, {})
end

--- Progress of a running rewrite: the statusline (always) and one line in the message
--- area, replaced in place, at most every `progress_interval_ms` unless `final`
--- (true: done; 'cancel' or 'failed').
--- Never vim.notify: a notification per update would pile up (nvim-notify, noice).
function M.progress(msg, final)
  vim.schedule(function()
    pcall(vim.cmd, 'redrawstatus')
  end)
  local opts = require('echoline.config').options
  if not opts.progress then
    return
  end
  local now = vim.uv.now()
  if final or now - last_progress >= M.progress_interval_ms then
    last_progress = now
    echo('echoline: ' .. msg, final)
  end
end

return M
