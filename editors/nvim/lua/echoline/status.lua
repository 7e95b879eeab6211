-- Server state for statuslines and progress messages.
local M = {}

M.state = { state = 'idle', model = nil, message = nil, tokS = nil, acceptance = nil, rewriting = nil }

local last_notify = 0

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

--- A short string for 'statusline': `%{v:lua.require'echoline'.statusline()}`.
function M.statusline()
  local s = M.state
  if s.state == 'idle' then
    return ''
  end
  local parts = { 'echoline' }
  if s.model then
    parts[#parts + 1] = s.model
  end
  if s.rewriting then
    parts[#parts + 1] = 'rewriting ' .. M.describe(s.rewriting)
  elseif s.state ~= 'ready' then
    parts[#parts + 1] = s.state
  else
    local st = M.describe({ tokS = s.tokS, acceptance = s.acceptance })
    if st ~= '' then
      parts[#parts + 1] = st
    end
  end
  return table.concat(parts, ' · ')
end

--- Throttled progress message (at most every 500 ms unless `force`).
function M.progress(msg, force)
  local opts = require('echoline.config').options
  if not opts.notify_progress then
    return
  end
  local now = vim.uv.now()
  if force or now - last_notify > 500 then
    last_notify = now
    vim.notify('echoline: ' .. msg, vim.log.levels.INFO, { title = 'echoline' })
  end
end

return M
