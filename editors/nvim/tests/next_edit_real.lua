-- Edit predictions against the real server (`echoline serve`), run by
-- tests/test_editor_nvim_next_edit.py when the server answers echoline/nextEdit:
--   ECHOLINE_TEST_FILE=... ECHOLINE_TEST_OUT=... ECHOLINE_TEST_CMD='<json list>' \
--     nvim --headless --clean -c 'luafile next_edit_real.lua'
-- A repeated change is made (line 17's print becomes logger.info), a prediction is asked
-- with :EcholineNextEdit; whatever the model predicts, the plugin must get an answer
-- without error, for the buffer's version, and (when there is an edit) apply exactly
-- that answer with the mapping. Records the buffer before and after and the prediction.
local env = vim.env
local here = vim.fs.dirname(vim.fs.normalize(debug.getinfo(1, 'S').source:sub(2)))
vim.opt.rtp:prepend(vim.fs.dirname(here))
vim.cmd('runtime plugin/echoline.lua')
local t = dofile(here .. '/harness.lua').new(env.ECHOLINE_TEST_OUT, 'next_edit_real')
local record = t.record
local sleep = t.sleep

local function wait(what, cond, ms)
  t.wait(what, cond, ms or 240000, 50)
end

t.run(function()
  require('echoline').setup({
    cmd = vim.json.decode(env.ECHOLINE_TEST_CMD),
    cmd_env = { PYTHONPATH = env.ECHOLINE_TEST_PYTHONPATH },
    model = env.ECHOLINE_TEST_MODEL or 'smollm2',
    backend = env.ECHOLINE_TEST_BACKEND or 'auto',
    ready_timeout_s = 600,
    ghost_text = false,
    inline_warm = false,
    next_edit = true, -- the server answers only when on (off by default); the command asks
  })
  vim.cmd('edit ' .. vim.fn.fnameescape(env.ECHOLINE_TEST_FILE))
  local b = vim.api.nvim_get_current_buf()
  wait('the client', function()
    local c = require('echoline').client(b)
    return c and c.initialized
  end)
  vim.api.nvim_win_set_cursor(0, { 17, 4 })
  vim.api.nvim_input('ciwlogger.info<Esc>')
  wait('the edit', function()
    return vim.api.nvim_buf_get_lines(b, 16, 17, false)[1]:find('logger.info', 1, true) ~= nil
  end, 5000)
  sleep(200)
  local ne = require('echoline.next_edit')
  local done, what = false, nil
  record.version = require('echoline.compat').buf_version(b)
  require('echoline').next_edit(b, {
    on_result = function(_, w)
      done, what = true, w
    end,
  })
  wait('the answer', function()
    return done
  end)
  record.what = what
  record.before = vim.api.nvim_buf_get_lines(b, 0, -1, false)
  local pred = ne.get(b)
  if pred then
    record.edits = pred.edits
    record.pred_version = pred.version
    require('echoline').next_edit_accept(b) -- jump (or apply, if the cursor is on it)
    if ne.get(b) then
      require('echoline').next_edit_accept(b)
    end
    record.last = ne.last[b]
  end
  record.after = vim.api.nvim_buf_get_lines(b, 0, -1, false)
  record.ok = true
  t.save()
  vim.cmd('qa!')
end)
