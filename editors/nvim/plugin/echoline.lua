-- User commands; the client itself starts from require('echoline').setup().
if vim.g.loaded_echoline then
  return
end
vim.g.loaded_echoline = true

vim.api.nvim_create_user_command('EcholineRewrite', function(a)
  local opts = { line1 = a.line1, line2 = a.line2 }
  if a.bang then
    opts.confirm = false -- apply without preview; else the `confirm` option decides
  end
  if a.args == '' then
    -- No instruction on the command line: ask for one.
    require('echoline').rewrite_prompt(opts)
  else
    require('echoline').rewrite(a.args, opts)
  end
end, {
  range = true,
  nargs = '*',
  bang = true,
  desc = 'echoline: rewrite the range with an instruction (none: prompt; ! applies without preview)',
})

vim.api.nvim_create_user_command('EcholineToggle', function(a)
  local want = nil
  if a.args == 'on' then
    want = true
  elseif a.args == 'off' then
    want = false
  end
  local on = require('echoline').toggle(want)
  vim.api.nvim_echo({ { 'echoline: inline suggestions ' .. (on and 'on' or 'off') } }, false, {})
end, {
  nargs = '?',
  complete = function()
    return { 'on', 'off' }
  end,
  desc = 'echoline: turn inline suggestions on/off',
})

vim.api.nvim_create_user_command('EcholineCancel', function()
  if not require('echoline').cancel(0) then
    vim.notify('echoline: no rewrite running in this buffer', vim.log.levels.INFO)
  end
end, { desc = 'echoline: cancel the running rewrite' })

vim.api.nvim_create_user_command('EcholineSuggest', function()
  require('echoline').suggest(0)
end, { desc = 'echoline: request an inline suggestion at the cursor' })

vim.api.nvim_create_user_command('EcholineNextEdit', function()
  require('echoline').next_edit(0)
end, { desc = 'echoline: predict the next edit at the cursor now' })

vim.api.nvim_create_user_command('EcholineNextEditAccept', function()
  if not require('echoline').next_edit_accept(0) then
    vim.notify('echoline: no predicted edit shown', vim.log.levels.INFO)
  end
end, { desc = 'echoline: jump to the predicted edit, then apply it' })

vim.api.nvim_create_user_command('EcholineNextEditDismiss', function()
  require('echoline').next_edit_dismiss(0)
end, { desc = 'echoline: dismiss the predicted edit' })

vim.api.nvim_create_user_command('EcholineStatus', function()
  vim.notify(require('echoline.status').report(), vim.log.levels.INFO)
end, { desc = 'echoline: show the server state' })
