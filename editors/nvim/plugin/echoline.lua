-- User commands; the client itself starts from require('echoline').setup().
if vim.g.loaded_echoline then
  return
end
vim.g.loaded_echoline = true

vim.api.nvim_create_user_command('EcholineRewrite', function(a)
  require('echoline').rewrite(a.args, { line1 = a.line1, line2 = a.line2, confirm = not a.bang and nil or false })
end, { range = true, nargs = '*', bang = true, desc = 'echoline: rewrite the range with an instruction (! applies without preview)' })

vim.api.nvim_create_user_command('EcholineCancel', function()
  if not require('echoline').cancel(0) then
    vim.notify('echoline: no rewrite running in this buffer', vim.log.levels.INFO)
  end
end, { desc = 'echoline: cancel the running rewrite' })

vim.api.nvim_create_user_command('EcholineSuggest', function()
  require('echoline').suggest(0)
end, { desc = 'echoline: request an inline suggestion at the cursor' })

vim.api.nvim_create_user_command('EcholineStatus', function()
  local s = require('echoline').statusline()
  vim.notify(s ~= '' and s or 'echoline: not running', vim.log.levels.INFO)
end, { desc = 'echoline: show the server state' })
