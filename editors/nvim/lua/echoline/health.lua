-- :checkhealth echoline
local M = {}

local health = vim.health

function M.check()
  health.start('echoline')
  if vim.fn.has('nvim-0.10') == 1 then
    health.ok('Neovim ' .. tostring(vim.version()))
  else
    health.error('Neovim 0.10 or newer is required (vim.lsp.start, inline virtual text)')
  end
  if vim.fn.has('nvim-0.12') == 1 and vim.lsp.inline_completion then
    health.ok('inline completion: built-in vim.lsp.inline_completion')
  else
    health.ok('inline completion: ghost text drawn by echoline (extmarks)')
  end

  local config = require('echoline.config')
  local o = config.options
  local cmd = config.cmd(o)
  if vim.fn.executable(cmd[1]) == 1 then
    health.ok('server command: ' .. table.concat(cmd, ' '))
  else
    health.error('server command not executable: ' .. cmd[1], {
      'pip install echoline (provides `echoline serve`)',
      "or setup({ cmd = { '/path/to/python', '-m', 'echoline', 'serve' } })",
    })
    return
  end
  -- A python interpreter running the sidecar module: check it imports.
  if cmd[2] == '-m' and cmd[3] then
    local r = vim.system({ cmd[1], '-c', 'import ' .. cmd[3] }, { text = true, env = o.cmd_env, cwd = o.cmd_cwd }):wait(20000)
    if r.code == 0 then
      health.ok(cmd[1] .. ' can import ' .. cmd[3])
    else
      health.error(cmd[1] .. ' cannot import ' .. cmd[3] .. ': ' .. vim.trim(r.stderr or ''))
    end
  end
  health.info(string.format('model=%s backend=%s speculation=%s max_tokens=%s confirm=%s',
    tostring(o.model), tostring(o.backend), tostring(o.speculation), tostring(o.max_tokens), tostring(o.confirm)))

  local clients = vim.lsp.get_clients({ name = 'echoline' })
  if #clients == 0 then
    health.info('no echoline client running (it starts when a configured filetype opens)')
  else
    for _, c in ipairs(clients) do
      local caps = c.server_capabilities or {}
      health.ok(string.format('client %d running, root %s', c.id, tostring(c.root_dir or c.config.root_dir)))
      if caps.inlineCompletionProvider then
        health.ok('server offers textDocument/inlineCompletion')
      else
        health.warn('server does not advertise inlineCompletionProvider')
      end
      local cmds = caps.executeCommandProvider and caps.executeCommandProvider.commands or {}
      if vim.tbl_contains(cmds, 'echoline.rewrite') then
        health.ok('server offers echoline.rewrite')
      else
        health.warn('server does not list the echoline.rewrite command')
      end
    end
  end
  M.doctor(cmd, o)
  local ghost = require('echoline.ghost')
  health.info('inline suggestions: ' .. (ghost.enabled and 'on' or 'off (:EcholineToggle turns them on)'))
  local st = require('echoline.status').state
  health.info('state: ' .. tostring(st.state) .. (st.message and (' (' .. tostring(st.message) .. ')') or ''))
  if st.exactness then
    health.info('inference server: exactness ' .. tostring(st.exactness) .. ' (docs/team.md, "Exactness")')
  end
end

-- The server's own set-up report (`echoline doctor --json`: libraries, the backend auto
-- picks, the model's cache state, cache folders), derived from the server command.
function M.doctor_cmd(cmd, o)
  for i, a in ipairs(cmd) do
    if a == 'serve' then
      local d = vim.list_slice(cmd, 1, i - 1)
      vim.list_extend(d, { 'doctor', '--json', '--model', tostring(o.model) })
      return d
    end
  end
  return nil
end

function M.doctor(cmd, o)
  local dcmd = M.doctor_cmd(cmd, o)
  if not dcmd then
    health.info('set-up report skipped: the server command does not end in `serve`')
    return
  end
  local r = vim.system(dcmd, { text = true, env = o.cmd_env, cwd = o.cmd_cwd }):wait(60000)
  local lines = vim.split(vim.trim(r.stdout or ''), '\n')
  local ok, report = pcall(vim.json.decode, lines[#lines] or '')
  if not ok or type(report) ~= 'table' or type(report.checks) ~= 'table' then
    health.error('`' .. table.concat(dcmd, ' ') .. '` gave no report: ' .. vim.trim(r.stderr or ''))
    return
  end
  for _, c in ipairs(report.checks) do
    local line = c.name .. ': ' .. tostring(c.detail)
    if c.ok then
      health.ok(line)
    elseif c.required then
      health.error(line)
    else
      health.warn(line)
    end
  end
end

return M
