-- Headless end-to-end scenarios for the Neovim client, run by tests/test_editor_nvim.py:
--   nvim --headless --clean -l e2e.lua SCENARIO FILE OUT.json SERVER_CMD...
-- Settings come from the environment (ECHOLINE_TEST_*). The script edits FILE in a
-- real buffer through the plugin, :writes it, records what it saw in OUT.json and
-- exits non-zero on any failure.
local scenario, file, out = arg[1], arg[2], arg[3]
local cmd = {}
for i = 4, #arg do
  cmd[#cmd + 1] = arg[i]
end
local here = vim.fs.dirname(vim.fs.normalize(debug.getinfo(1, 'S').source:sub(2)))
local plugin_root = vim.fs.dirname(here)
vim.opt.rtp:prepend(plugin_root)
vim.cmd('runtime plugin/echoline.lua')

local env = vim.env
local timeout = tonumber(env.ECHOLINE_TEST_TIMEOUT_MS or '180000')
local t = dofile(here .. '/harness.lua').new(out, scenario)
local record, save, fail = t.record, t.save, t.fail

local function wait(what, cond, ms)
  if not vim.wait(ms or timeout, cond, 20) then
    fail('timed out waiting for ' .. what)
  end
end

-- The load as the user sees it: each echoline/status (with the statusline it makes), the
-- $/progress Neovim got, and every vim.notify at ERROR level (none may come while loading).
record.load = { statuses = {}, progress = {}, errors = {} }
local status_mod = require('echoline.status')
local status_update = status_mod.update
status_mod.update = function(t)
  status_update(t)
  if t.state then
    local line = status_mod.statusline()
    table.insert(record.load.statuses, { state = t.state, message = t.message, statusline = line })
  end
end
vim.api.nvim_create_autocmd('LspProgress', {
  callback = function(ev)
    local v = ((ev.data or {}).params or {}).value or {}
    table.insert(record.load.progress, { kind = v.kind, title = v.title, message = v.message })
  end,
})
local notify = vim.notify
vim.notify = function(msg, level, opts)
  if level and level >= vim.log.levels.ERROR then
    table.insert(record.load.errors, { state = status_mod.state.state, message = tostring(msg) })
  end
  return notify(msg, level, opts)
end

local echoline = require('echoline')

--- Ask for an inline completion at the cursor now and wait for the answer: the
--- suggestion (nil: none) and the milliseconds it took.
local function suggest_now(bufnr)
  local got, answered = nil, false
  local t0 = vim.uv.hrtime()
  echoline.suggest(bufnr, {
    on_result = function(s)
      answered = true
      got = s
    end,
  })
  wait('the inline completion', function() return answered end)
  return got, (vim.uv.hrtime() - t0) / 1e6
end
echoline.setup({
  cmd = cmd,
  cmd_env = { PYTHONPATH = env.ECHOLINE_TEST_PYTHONPATH },
  model = env.ECHOLINE_TEST_MODEL or 'smollm2',
  backend = env.ECHOLINE_TEST_BACKEND or 'auto',
  max_tokens = tonumber(env.ECHOLINE_TEST_MAX_TOKENS or '64'),
  -- A first load on a fresh CI machine (relayout, calibration) can pass 60 s on 2 busy cores.
  ready_timeout_s = 240,
  confirm = false,
  auto_trigger = false,
  notify_progress = false,
})
vim.cmd('edit ' .. vim.fn.fnameescape(file))
local bufnr = vim.api.nvim_get_current_buf()
wait('the client to initialize', function()
  local c = echoline.client(bufnr)
  return c ~= nil and c.initialized == true
end, 60000)
local client = echoline.client(bufnr)
record.capabilities = {
  inline = client.server_capabilities.inlineCompletionProvider ~= nil,
  commands = (client.server_capabilities.executeCommandProvider or {}).commands,
}
local original = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
record.original = original

local function lines_env(name)
  local v = tonumber(env[name])
  if not v then
    fail(name .. ' is not set')
  end
  return v
end

if scenario == 'rewrite' then
  local l1, l2 = lines_env('ECHOLINE_TEST_LINE1'), lines_env('ECHOLINE_TEST_LINE2')
  local done = false
  local t0 = vim.uv.hrtime()
  local progress = 0
  require('echoline.client').rewrite_listeners[vim.uri_from_bufnr(bufnr)] = nil
  local id = echoline.rewrite(env.ECHOLINE_TEST_INSTRUCTION or '', {
    bufnr = bufnr,
    line1 = l1,
    line2 = l2,
    on_done = function(applied, reason, result)
      done = true
      record.applied = applied
      record.reason = reason
      record.result = result
    end,
  })
  if not id then
    fail('rewrite request not sent')
  end
  -- Count progress notifications (echoline/rewriteProgress and $/progress).
  vim.api.nvim_create_autocmd('LspProgress', { callback = function() progress = progress + 1 end })
  wait('the rewrite', function() return done end)
  record.seconds = (vim.uv.hrtime() - t0) / 1e9
  record.status = require('echoline.status').state
  record.lsp_progress_events = progress
  if not record.applied then
    fail('rewrite not applied: ' .. tostring(record.reason))
  end
  record.buffer = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  vim.cmd('write')
elseif scenario == 'preview' then
  local l1, l2 = lines_env('ECHOLINE_TEST_LINE1'), lines_env('ECHOLINE_TEST_LINE2')
  local done = false
  echoline.rewrite(env.ECHOLINE_TEST_INSTRUCTION or '', {
    bufnr = bufnr,
    line1 = l1,
    line2 = l2,
    confirm = true,
    on_done = function(applied, reason, result)
      done = true
      record.applied = applied
      record.reason = reason
      record.result = result
    end,
  })
  wait('the diff preview', function() return #vim.api.nvim_list_tabpages() == 2 end)
  local wins = vim.api.nvim_tabpage_list_wins(0)
  record.preview = {}
  for _, w in ipairs(wins) do
    record.preview[#record.preview + 1] = {
      diff = vim.wo[w].diff,
      lines = vim.api.nvim_buf_get_lines(vim.api.nvim_win_get_buf(w), 0, -1, false),
    }
  end
  if vim.bo[bufnr].modified then
    fail('the preview modified the buffer before accepting')
  end
  vim.api.nvim_feedkeys(env.ECHOLINE_TEST_KEY or 'a', 'mx', false)
  wait('accept', function() return done end, 5000)
  record.tabs_after = #vim.api.nvim_list_tabpages()
  record.buffer = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  vim.cmd('write')
elseif scenario == 'ghost' then
  local row, col = lines_env('ECHOLINE_TEST_ROW'), lines_env('ECHOLINE_TEST_COL')
  -- Insert mode puts the cursor after the last character; normal mode (this script)
  -- needs 'virtualedit' for that.
  vim.o.virtualedit = 'onemore'
  vim.api.nvim_win_set_cursor(0, { row, col })
  record.cursor_before = vim.api.nvim_win_get_cursor(0)
  -- The cursor came to rest there (what Neovim's main loop fires after a move): the
  -- plugin reports it and the server warms the inline prompt before the request.
  vim.api.nvim_exec_autocmds('CursorMoved', { buffer = bufnr })
  local cursor_mod = require('echoline.cursor')
  wait('the inline warm-up', function()
    local w = cursor_mod.last_warm
    return w ~= nil and w.uri == vim.uri_from_bufnr(bufnr) and w.state == 'done'
      and w.detail ~= nil and w.detail.tokens ~= nil and w.detail.tokens > 30
  end)
  record.warm = cursor_mod.last_warm
  local got = suggest_now(bufnr)
  if not got then
    fail('no ghost text was shown (empty or no completion)')
  end
  local marks = vim.api.nvim_buf_get_extmarks(bufnr, require('echoline.ghost').ns, 0, -1, { details = true })
  if #marks ~= 1 then
    fail('expected one ghost extmark, found ' .. #marks)
  end
  local d = marks[1][4]
  record.extmark = { row = marks[1][2], col = marks[1][3], virt_text = d.virt_text, virt_lines = d.virt_lines }
  record.suggestion = { text = got.text, suffix = got.suffix, range = got.range }
  if vim.bo[bufnr].modified then
    fail('showing ghost text modified the buffer')
  end
  if not echoline.accept(bufnr) then
    fail('accept() found no suggestion')
  end
  if #vim.api.nvim_buf_get_extmarks(bufnr, require('echoline.ghost').ns, 0, -1, {}) ~= 0 then
    fail('ghost text still shown after accept')
  end
  record.cursor = vim.api.nvim_win_get_cursor(0)
  record.buffer = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  vim.cmd('write')
elseif scenario == 'type_through' then
  -- A suggestion is shown; the user types its first characters: the plugin keeps the rest
  -- on screen at once, and the server answers the next request with that same rest from
  -- its store of shown suggestions, with no model run (echoline.status's inlineStore).
  local row, col = lines_env('ECHOLINE_TEST_ROW'), lines_env('ECHOLINE_TEST_COL')
  vim.o.virtualedit = 'onemore'
  vim.api.nvim_win_set_cursor(0, { row, col })
  local function status()
    local res
    client:request('workspace/executeCommand', { command = 'echoline.status', arguments = {} }, function(_, r)
      res = r or {}
    end, bufnr)
    wait('echoline.status', function() return res ~= nil end, 30000)
    return res.inlineStore
  end
  local first = suggest_now(bufnr)
  if not first then
    fail('no ghost text was shown (empty or no completion)')
  end
  record.first = { text = first.text, suffix = first.suffix }
  local n = math.min(2, #first.suffix - 1)
  local typed = first.suffix:sub(1, n)
  if n < 1 or typed:find('\n') then
    fail('the suggestion is too short to type through: ' .. vim.inspect(first.suffix))
  end
  record.typed = typed
  local before = status()
  -- the keystrokes, as Neovim delivers them in Insert mode: the text, the cursor, the events
  vim.api.nvim_buf_set_text(bufnr, row - 1, col, row - 1, col, { typed })
  vim.api.nvim_win_set_cursor(0, { row, col + n })
  vim.api.nvim_exec_autocmds('CursorMovedI', { buffer = bufnr })
  vim.api.nvim_exec_autocmds('TextChangedI', { buffer = bufnr })
  local kept = require('echoline.ghost').get(bufnr)
  local marks = vim.api.nvim_buf_get_extmarks(bufnr, require('echoline.ghost').ns, 0, -1, { details = true })
  record.kept = kept and { suffix = kept.suffix, row = kept.row, col = kept.col } or vim.NIL
  record.kept_mark = marks[1] and { row = marks[1][2], col = marks[1][3], text = marks[1][4].virt_text[1][1] }
    or vim.NIL
  local second, ms = suggest_now(bufnr)
  record.second = second and { text = second.text, suffix = second.suffix } or vim.NIL
  record.second_ms = ms
  record.store_before, record.store_after = before, status()
  if not echoline.accept(bufnr) then
    fail('accept() found no suggestion')
  end
  vim.cmd('write')
elseif scenario == 'cancel' then
  local l1, l2 = lines_env('ECHOLINE_TEST_LINE1'), lines_env('ECHOLINE_TEST_LINE2')
  local done, reason = false, nil
  local uri = vim.uri_from_bufnr(bufnr)
  -- The model loads first (a fresh server, maybe a busy machine: it can take longer
  -- than the cancel window below), so the window measures the generation only.
  wait('the model to be ready', function()
    return require('echoline.status').state.state == 'ready'
  end)
  local id = echoline.rewrite(env.ECHOLINE_TEST_INSTRUCTION or '', {
    bufnr = bufnr,
    line1 = l1,
    line2 = l2,
    on_done = function(applied, r)
      done = true
      reason = r
      record.applied = applied
    end,
  })
  if not id then
    fail('rewrite request not sent')
  end
  -- Cancel once generation is under way (first progress), or after a short delay.
  local started = false
  local listener = require('echoline.client').rewrite_listeners[uri]
  require('echoline.client').rewrite_listeners[uri] = function(p)
    started = true
    if listener then
      listener(p)
    end
  end
  vim.wait(tonumber(env.ECHOLINE_TEST_CANCEL_AFTER_MS or '20000'), function() return started or done end, 10)
  record.cancelled_after_progress = started
  if done then
    fail('the rewrite finished before it could be cancelled')
  end
  if not echoline.cancel(bufnr) then
    fail('cancel() found no running rewrite')
  end
  wait('on_done after cancel', function() return done end, 5000)
  record.reason = reason
  -- Give a late answer or applyEdit time to arrive: it must not touch the buffer.
  vim.wait(tonumber(env.ECHOLINE_TEST_SETTLE_MS or '3000'), function() return false end, 50)
  record.buffer = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  record.modified = vim.bo[bufnr].modified
  -- The server must still answer after the cancel (not stuck behind the cancelled job).
  local answered, after_err = false, nil
  local c = echoline.client(bufnr)
  require('echoline.compat').request(c, 'textDocument/inlineCompletion', {
    textDocument = { uri = uri },
    position = { line = 1, character = 4 },
    context = { triggerKind = 1 },
  }, function(err)
    answered = true
    after_err = err and tostring(err.message) or nil
  end, bufnr)
  wait('a request after the cancel', function() return answered end, 60000)
  record.after_cancel_error = after_err
  local ok_after = answered and after_err == nil
  record.server_alive = ok_after
  vim.cmd('write')
else
  fail('unknown scenario ' .. tostring(scenario))
end

save()
local c = echoline.client(bufnr)
if c then
  if require('echoline.compat').has_011 then
    c:stop()
  else
    c.stop()
  end
  vim.wait(3000, function() return c:is_stopped() end, 20)
end
os.exit(0)
