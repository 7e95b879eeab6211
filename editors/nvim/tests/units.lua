-- Headless checks of the Neovim client without the real server, run by
-- tests/test_editor_nvim_units.py:
--   nvim --headless --clean -l units.lua SCENARIO OUT.json [ARG]
-- Each scenario records what it saw in OUT.json and exits non-zero on a failure.
local scenario, out, extra = arg[1], arg[2], arg[3]
local here = vim.fs.dirname(vim.fs.normalize(debug.getinfo(1, 'S').source:sub(2)))
local plugin_root = vim.fs.dirname(here)
local t = dofile(here .. '/harness.lua').new(out, scenario)
local record, save, fail, check, eq = t.record, t.save, t.fail, t.check, t.eq

if scenario ~= 'lazy_spec' then
  vim.opt.rtp:prepend(plugin_root)
  vim.cmd('runtime plugin/echoline.lua')
end

local function feed(keys)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(keys, true, false, true), 'mx', false)
end

--- A buffer with a name (the client only attaches to file buffers), current.
local function scratch(lines)
  vim.cmd('enew')
  local b = vim.api.nvim_get_current_buf()
  vim.api.nvim_buf_set_name(b, vim.fn.tempname() .. '.py')
  vim.bo[b].expandtab = false
  vim.api.nvim_buf_set_lines(b, 0, -1, false, lines or { 'x = ' })
  return b
end

local function line(b, n)
  return vim.api.nvim_buf_get_lines(b, (n or 1) - 1, n or 1, false)[1]
end

-- A language server inside this Neovim (vim.lsp accepts a function as `cmd`):
-- answers initialize and shutdown, records every message.
local messages = {}
local function fake_server(dispatchers)
  local closing, id = false, 0
  return {
    request = function(method, params, callback)
      id = id + 1
      messages[#messages + 1] = { method = method, params = params }
      vim.schedule(function()
        if method == 'initialize' then
          callback(nil, { capabilities = { inlineCompletionProvider = true, textDocumentSync = 2 } })
        else
          callback(nil, vim.NIL)
        end
      end)
      return true, id
    end,
    notify = function(method, params)
      messages[#messages + 1] = { method = method, params = params }
      if method == 'exit' then
        closing = true
        dispatchers.on_exit(0, 15)
      end
      return true
    end,
    is_closing = function()
      return closing
    end,
    terminate = function()
      closing = true
    end,
  }
end

if scenario == 'doc_tags' then
  -- Every command, option, mapping and API function has a help tag; every
  -- |echoline…| link points at one.
  local text = table.concat(vim.fn.readfile(plugin_root .. '/doc/echoline.txt'), '\n')
  local tags = {}
  for tag in text:gmatch('%*([^%s%*|]+)%*') do
    tags[tag] = true
  end
  local missing = {}
  local function need(tag)
    if not tags[tag] then
      missing[#missing + 1] = tag
    end
  end
  local commands = vim.tbl_keys(vim.api.nvim_get_commands({}))
  table.sort(commands)
  record.commands = {}
  for _, name in ipairs(commands) do
    if name:match('^Echoline') then
      record.commands[#record.commands + 1] = name
      need(':' .. name)
    end
  end
  local defaults = require('echoline.config').defaults
  for key, value in pairs(defaults) do
    need('echoline-option-' .. key)
    if key == 'keymaps' then
      for k in pairs(value) do
        need('echoline-keymaps.' .. k)
      end
    end
  end
  -- Options that are nil by default are not keys of the table: take them from the source.
  local src = table.concat(vim.fn.readfile(plugin_root .. '/lua/echoline/config.lua'), '\n')
  local block = src:match('M%.defaults = (%b{})')
  for key in block:gmatch('\n  ([%w_]+) = ') do
    need('echoline-option-' .. key)
  end
  for name, fn in pairs(require('echoline')) do
    if type(fn) == 'function' and not name:match('^_') then
      need('echoline.' .. name .. '()')
    end
  end
  for _, tag in ipairs({ 'echoline-lsp-config', 'echoline-lazy', 'echoline-fallthrough', 'EcholineGhost' }) do
    need(tag)
  end
  local broken = {}
  for link in text:gmatch('|([^%s|]+)|') do
    if (link:match('^echoline') or link:match('^:Echoline')) and not tags[link] then
      broken[#broken + 1] = link
    end
  end
  record.missing, record.broken = missing, broken
  record.ntags = vim.tbl_count(tags)
  check(#record.commands >= 5, 'too few commands: ' .. vim.inspect(record.commands))
  check(#missing == 0, 'help tags missing: ' .. table.concat(missing, ' '))
  check(#broken == 0, 'links to no tag: ' .. table.concat(broken, ' '))
elseif scenario == 'lsp_config' then
  check(vim.lsp.config ~= nil, 'vim.lsp.config needs Neovim 0.11')
  require('echoline').setup({ autostart = false, model = 'smollm2', filetypes = { 'python' }, max_tokens = 77 })
  local cfg = vim.lsp.config.echoline
  check(type(cfg) == 'table', 'vim.lsp.config.echoline is not a table')
  record.cmd = cfg.cmd
  record.root_markers = cfg.root_markers
  record.filetypes = cfg.filetypes
  record.settings = cfg.settings
  record.handlers = vim.tbl_keys(cfg.handlers or {})
  table.sort(record.handlers)
  eq(cfg.cmd, { 'echoline', 'serve' }, 'cmd')
  eq(cfg.filetypes, { 'python' }, 'filetypes')
  eq(cfg.settings.echoline.model, 'smollm2', 'settings.echoline.model')
  eq(cfg.settings.echoline.maxTokens, 77, 'settings.echoline.maxTokens')
  check(type(cfg.on_attach) == 'function', 'no on_attach')
  -- vim.lsp.enable() starts it (a server inside this Neovim stands in for the real one);
  -- the user's settings override reaches initializationOptions.
  vim.lsp.config('echoline', { cmd = fake_server, settings = { echoline = { replyHistory = 2 } } })
  vim.lsp.enable('echoline')
  local dir = vim.fn.tempname()
  vim.fn.mkdir(dir, 'p')
  vim.fn.writefile({}, dir .. '/.git')
  vim.fn.writefile({ 'x = 1' }, dir .. '/a.py')
  vim.cmd('edit ' .. dir .. '/a.py')
  local b = vim.api.nvim_get_current_buf()
  check(vim.wait(5000, function()
    return #vim.lsp.get_clients({ name = 'echoline', bufnr = b }) == 1
  end, 10), 'vim.lsp.enable did not attach an echoline client')
  local client = require('echoline').client(b)
  check(client ~= nil, "require('echoline').client() does not find it")
  local init
  for _, m in ipairs(messages) do
    if m.method == 'initialize' then
      init = m.params
    end
  end
  record.init_options = init and init.initializationOptions
  record.root = client.root_dir or (client.config and client.config.root_dir)
  eq(record.init_options.model, 'smollm2', 'initializationOptions.model')
  eq(record.init_options.replyHistory, 2, 'initializationOptions.replyHistory (vim.lsp.config override)')
  eq(vim.fs.normalize(record.root), vim.fs.normalize(dir), 'root_dir from root_markers')
  -- on_attach set up the ghost-text mappings.
  local tab = vim.fn.maparg('<Tab>', 'i', false, true)
  check(type(tab) == 'table' and tab.buffer == 1, 'no buffer-local <Tab> after on_attach')
  record.tab_desc = tab.desc
  client:stop(true)
elseif scenario == 'tab_fallthrough' then
  require('echoline').setup({
    autostart = false,
    keymaps = { accept = '<Tab>', accept_word = '<M-Right>', accept_line = '<M-C-Right>', dismiss = '<C-]>' },
  })
  local ghost = require('echoline.ghost')
  _G.show = function(text)
    local b = vim.api.nvim_get_current_buf()
    local c = vim.api.nvim_win_get_cursor(0)
    _G.shown = ghost.show_text(b, c[1] - 1, c[2], text, nil) ~= nil
  end
  record.cases = {}

  -- 1. No mapping of <Tab> anywhere: the key itself.
  local b = scratch({ 'x = ' })
  ghost.attach(nil, b)
  feed('A<Tab>1<Esc>')
  record.cases.plain = line(b)
  eq(line(b), 'x = \t1', 'no previous mapping: a literal tab')

  -- 2. A global Lua mapping made before the client attached.
  vim.g.tab_hits = 0
  vim.keymap.set('i', '<Tab>', function()
    vim.g.tab_hits = vim.g.tab_hits + 1
  end, { desc = 'a completion plugin' })
  b = scratch({ 'x = ' })
  ghost.attach(nil, b)
  feed('A<Tab>1<Esc>')
  record.cases.global_lua = { line = line(b), hits = vim.g.tab_hits }
  eq(vim.g.tab_hits, 1, 'the global Lua <Tab> mapping ran')
  eq(line(b), 'x = 1', 'nothing else was inserted')
  vim.keymap.del('i', '<Tab>')

  -- 3. A global mapping made after the client attached (looked up when pressed).
  b = scratch({ 'x = ' })
  ghost.attach(nil, b)
  vim.cmd('inoremap <Tab> LATE')
  feed('A<Tab><Esc>')
  record.cases.global_later = line(b)
  eq(line(b), 'x = LATE', 'a global mapping made later')
  vim.cmd('iunmap <Tab>')

  -- 4. A buffer-local <expr> mapping replaced by ours: kept and followed.
  b = scratch({ 'x = ' })
  vim.cmd([[inoremap <buffer> <expr> <Tab> pumvisible() ? "\<C-n>" : "EXPR"]])
  ghost.attach(nil, b)
  feed('A<Tab><Esc>')
  record.cases.buffer_expr = line(b)
  eq(line(b), 'x = EXPR', 'the buffer-local <expr> mapping')

  -- 5. A recursive mapping whose rhs holds <Tab> (must not loop).
  b = scratch({ 'x = ' })
  vim.cmd('imap <buffer> <Tab> <Tab><Tab>')
  ghost.attach(nil, b)
  feed('A<Tab>1<Esc>')
  record.cases.recursive = line(b)
  eq(line(b), 'x = \t\t1', 'a recursive mapping with the key in its rhs')

  -- 6. A suggestion is shown: <Tab> accepts it (no fallthrough).
  vim.g.tab_hits = 0
  vim.keymap.set('i', '<Tab>', function()
    vim.g.tab_hits = vim.g.tab_hits + 1
  end)
  b = scratch({ 'x = ' })
  ghost.attach(nil, b)
  feed('A<Cmd>lua show("compute(a, b)")<CR><Tab>!<Esc>')
  record.cases.accept = { line = line(b), hits = vim.g.tab_hits, shown = _G.shown }
  check(_G.shown, 'the suggestion was not shown')
  eq(line(b), 'x = compute(a, b)!', '<Tab> accepted the suggestion')
  eq(vim.g.tab_hits, 0, 'the previous mapping did not run')

  -- 7. Accept word, then line, then the rest.
  b = scratch({ 'y = ' })
  ghost.attach(nil, b)
  local steps = {}
  _G.snap = function(name)
    local s = ghost.get(b)
    steps[#steps + 1] = {
      name = name,
      lines = vim.api.nvim_buf_get_lines(b, 0, -1, false),
      suffix = s and s.suffix or vim.NIL,
      marks = #vim.api.nvim_buf_get_extmarks(b, ghost.ns, 0, -1, {}),
    }
  end
  _G.fire = function()
    -- What Neovim does after a change in Insert mode: the rest must stay shown.
    vim.api.nvim_exec_autocmds('TextChangedI', { buffer = b })
  end
  feed('A<Cmd>lua show("foo_bar(baz, qux)\\nreturn 1")<CR>'
    .. '<M-Right><Cmd>lua fire()<CR><Cmd>lua snap("word")<CR>'
    .. '<M-Right><Cmd>lua snap("word2")<CR>'
    .. '<M-C-Right><Cmd>lua snap("line")<CR>'
    .. '<Tab><Cmd>lua snap("all")<CR><Esc>')
  record.cases.partial = steps
  eq(steps[1].lines, { 'y = foo_bar' }, 'accept word')
  eq(steps[1].suffix, '(baz, qux)\nreturn 1', 'the rest after a word (and TextChangedI)')
  eq(steps[2].lines, { 'y = foo_bar(' }, 'accept word: punctuation')
  eq(steps[3].lines, { 'y = foo_bar(baz, qux)' }, 'accept line')
  eq(steps[3].suffix, '\nreturn 1', 'the rest after a line')
  eq(steps[4].lines, { 'y = foo_bar(baz, qux)', 'return 1' }, 'accept the rest')
  eq(steps[4].suffix, vim.NIL, 'nothing shown after accepting all')

  -- 8. An item with a range (it replaces the typed "co" and the ")" after the cursor):
  -- accept a word, then the rest; the range moves with the inserted text.
  b = scratch({ 'x = co)' })
  ghost.attach(nil, b)
  steps = {}
  _G.show_range = function()
    _G.shown = ghost.show_text(b, 0, 6, 'compute(a)', { srow = 0, scol = 4, erow = 0, ecol = 7 }) ~= nil
  end
  feed('0f)i<Cmd>lua show_range()<CR><M-Right><Cmd>lua snap("word")<CR><Tab><Cmd>lua snap("all")<CR><Esc>')
  record.cases.range = steps
  eq(steps[1].lines, { 'x = compute)' }, 'range item: accept word')
  eq(steps[1].suffix, '(a)', 'range item: the rest')
  eq(steps[2].lines, { 'x = compute(a)' }, 'range item: accept the rest replaces the range')

  -- 9. Accept word with no suggestion falls through as well (a global mapping here).
  vim.cmd('inoremap <M-Right> MR')
  b = scratch({ 'z' })
  ghost.attach(nil, b)
  feed('A<M-Right><Esc>')
  record.cases.word_fallthrough = line(b)
  eq(line(b), 'zMR', '<M-Right> without a suggestion')
  vim.cmd('iunmap <M-Right>')

  -- 10. Typing through a suggestion keeps it shown, its rest at the new cursor (the
  -- events Neovim fires after a keystroke: CursorMovedI, then TextChangedI); a character
  -- it does not continue with drops it. With a range item the range moves right.
  b = scratch({ 'x = )' })
  ghost.attach(nil, b)
  steps = {}
  _G.moved = function()
    vim.api.nvim_exec_autocmds('CursorMovedI', { buffer = b })
    vim.api.nvim_exec_autocmds('TextChangedI', { buffer = b })
  end
  _G.show_at = function()
    _G.shown = ghost.show_text(b, 0, 4, 'max(a, b))', { srow = 0, scol = 4, erow = 0, ecol = 5 }) ~= nil
  end
  feed('0f)i<Cmd>lua show_at()<CR>m<Cmd>lua moved()<CR><Cmd>lua snap("m")<CR>'
    .. 'ax<Cmd>lua moved()<CR><Cmd>lua snap("max")<CR>'
    .. '<BS><Cmd>lua moved()<CR><Cmd>lua snap("bs")<CR><Esc>')
  record.cases.type_through = steps
  eq(steps[1].suffix, 'ax(a, b))', 'typed "m": the rest shown')
  eq(steps[2].suffix, '(a, b))', 'typed "max": the rest shown')
  eq(steps[2].marks, 1, 'one ghost mark after typing through')
  b = scratch({ 'x = )' })
  ghost.attach(nil, b)
  steps = {}
  feed('0f)i<Cmd>lua show_at()<CR>mi<Cmd>lua moved()<CR><Cmd>lua snap("mi")<CR>'
    .. '<Cmd>lua show_at()<CR><Cmd>lua snap("again")<CR>'
    .. '<Esc>')
  eq(steps[1].suffix, vim.NIL, 'typed "mi": departed, nothing shown')
  record.cases.departed = steps
  b = scratch({ 'x = ' })
  ghost.attach(nil, b)
  steps = {}
  feed('A<Cmd>lua show("total")<CR>to<Cmd>lua moved()<CR><Cmd>lua snap("to")<CR><Tab><Cmd>lua snap("all")<CR><Esc>')
  eq(steps[1].suffix, 'tal', 'no range: typed "to", the rest shown')
  eq(steps[2].lines, { 'x = total' }, 'accepting the kept rest')
elseif scenario == 'toggle' then
  require('echoline').setup({ autostart = false })
  local ghost = require('echoline.ghost')
  local status = require('echoline.status')
  status.update({ state = 'ready', model = 'smollm2' })
  local b = scratch({ 'x = ' })
  ghost.attach(nil, b)
  vim.api.nvim_win_set_cursor(0, { 1, 4 })
  check(ghost.show_text(b, 0, 4, 'ok', nil) ~= nil, 'show_text drew nothing')
  vim.cmd('EcholineToggle')
  record.off = { enabled = ghost.enabled, shown = ghost.get(b) ~= nil, statusline = status.statusline() }
  eq(ghost.enabled, false, ':EcholineToggle turns suggestions off')
  eq(ghost.get(b), nil, 'the shown suggestion is cleared')
  eq(#vim.api.nvim_buf_get_extmarks(b, ghost.ns, 0, -1, {}), 0, 'no ghost extmark left')
  check(status.statusline():find('inline off', 1, true) ~= nil, 'statusline: ' .. status.statusline())
  vim.cmd('EcholineToggle')
  eq(ghost.enabled, true, ':EcholineToggle turns them on again')
  vim.cmd('EcholineToggle off')
  eq(ghost.enabled, false, ':EcholineToggle off')
  vim.cmd('EcholineToggle off')
  eq(ghost.enabled, false, ':EcholineToggle off twice')
  vim.cmd('EcholineToggle on')
  eq(ghost.enabled, true, ':EcholineToggle on')
  record.on = { enabled = ghost.enabled, statusline = status.statusline() }
  check(status.statusline():find('inline off', 1, true) == nil, 'statusline still says off')
elseif scenario == 'status_models' then
  -- echoline/status's models and modelSummary, through the client's handler.
  require('echoline').setup({ autostart = false })
  local status = require('echoline.status')
  local on_status = vim.lsp.config.echoline.handlers['echoline/status']
  local notes = {}
  vim.notify = function(msg)
    notes[#notes + 1] = msg
  end
  local one = { model = 'qwen2.5-coder-0.5b', reason = 'default' }
  on_status(nil, {
    state = 'ready',
    model = 'qwen2.5-coder-0.5b',
    models = { rewrite = one, inline = one },
    modelSummary = 'rewrite: qwen2.5-coder-0.5b (default) · inline: qwen2.5-coder-0.5b (default)',
  })
  record.same = status.statusline()
  vim.cmd('EcholineStatus')
  on_status(nil, {
    state = 'ready',
    model = 'qwen2.5-coder-1.5b',
    models = { rewrite = { model = 'qwen2.5-coder-1.5b' }, inline = one },
    modelSummary = 'rewrite: qwen2.5-coder-1.5b (gpu) · inline: qwen2.5-coder-0.5b (default)',
  })
  record.differ = status.statusline()
  vim.cmd('EcholineStatus')
  record.notes = notes
elseif scenario == 'rewrite_prompt' then
  local echoline = require('echoline')
  echoline.setup({ autostart = false })
  scratch({ 'a', 'b', 'c', 'd' })
  local calls, prompts = {}, {}
  echoline.rewrite = function(instruction, opts)
    calls[#calls + 1] = { instruction = instruction, line1 = opts.line1, line2 = opts.line2, confirm = opts.confirm }
  end
  local answer
  vim.ui.input = function(opts, on_confirm)
    prompts[#prompts + 1] = opts.prompt
    on_confirm(answer)
  end
  answer = 'add type hints'
  vim.cmd('2,3EcholineRewrite')
  answer = nil -- the prompt cancelled: nothing happens
  vim.cmd('EcholineRewrite')
  answer = '' -- an empty instruction: the model tidies the lines
  vim.cmd('4EcholineRewrite')
  vim.cmd('1EcholineRewrite! use f-strings') -- an instruction given: no prompt
  record.calls, record.prompts = calls, prompts
  eq(#prompts, 3, 'prompts asked')
  eq(#calls, 3, 'rewrites started')
  eq(calls[1], { instruction = 'add type hints', line1 = 2, line2 = 3 }, 'first rewrite')
  eq(calls[2], { instruction = '', line1 = 4, line2 = 4 }, 'empty instruction')
  eq(calls[3], { instruction = 'use f-strings', line1 = 1, line2 = 1, confirm = false }, 'with ! and an instruction')
elseif scenario == 'progress' then
  local config = require('echoline.config')
  local status = require('echoline.status')
  local notes, echoes = 0, {}
  vim.notify = function()
    notes = notes + 1
  end
  local real_echo = vim.api.nvim_echo
  vim.api.nvim_echo = function(chunks, history, opts)
    echoes[#echoes + 1] = { text = chunks[1][1], history = history }
    return real_echo(chunks, history, opts)
  end
  config.set({})
  local t0 = vim.uv.now()
  for i = 1, 200 do
    status.progress(string.format('%d tok, 40.0 tok/s', i))
  end
  local burst = #echoes
  local elapsed = vim.uv.now() - t0
  status.progress('done: 200 tok', true)
  record.notify_calls, record.echoes, record.burst_ms = notes, echoes, elapsed
  eq(notes, 0, 'vim.notify calls during a rewrite')
  if elapsed < status.progress_interval_ms then
    eq(burst, 1, 'echoes in one throttle interval')
  end
  check(#echoes == burst + 1, 'the final message is always shown')
  eq(echoes[#echoes].text, 'echoline: done: 200 tok', 'final message')
  -- The older option name still turns it off.
  config.set({ notify_progress = false })
  eq(config.options.progress, false, 'notify_progress = false')
  local before = #echoes
  status.progress('x', true)
  eq(#echoes, before, 'no echo with progress off')
elseif scenario == 'lazy_spec' then
  -- The lazy.nvim spec from docs/editors.md (ARG: a file with it), called the way
  -- lazy.nvim calls it, with `dir` where lazy.nvim would have cloned the repository.
  local spec = dofile(extra)
  check(type(spec) == 'table' and type(spec.config) == 'function', 'the spec has no config function')
  record.name = spec[1] or spec.url
  check(spec.dir == nil, 'the spec must not need a dir')
  local clone = assert(vim.env.ECHOLINE_TEST_CLONE, 'ECHOLINE_TEST_CLONE')
  spec.config({ dir = clone, name = 'echoline' }, spec.opts or {})
  record.commands = vim.tbl_filter(function(n)
    return n:match('^Echoline') ~= nil
  end, vim.tbl_keys(vim.api.nvim_get_commands({})))
  table.sort(record.commands)
  check(vim.tbl_contains(record.commands, 'EcholineRewrite'), 'no :EcholineRewrite after config()')
  check(vim.fn.filereadable(clone .. '/editors/nvim/doc/tags') == 1, 'helptags were not generated')
  local ok, err = pcall(vim.cmd, 'help :EcholineToggle')
  check(ok, ':help :EcholineToggle: ' .. tostring(err))
  record.help_buffer = vim.fn.fnamemodify(vim.api.nvim_buf_get_name(0), ':t')
  eq(record.help_buffer, 'echoline.txt', 'the help buffer')
  vim.cmd('helpclose')
  eq(require('echoline.config').options.model, (spec.opts or {}).model or 'qwen2.5-coder-0.5b', 'setup(opts) ran')
  check(#vim.api.nvim_get_runtime_file('lsp/echoline.lua', false) == 1, 'lsp/echoline.lua not on the runtimepath')
else
  fail('unknown scenario ' .. tostring(scenario))
end

save()
os.exit(0)
