-- What the headless test scripts (e2e.lua, units.lua) share: the record they write to
-- OUT.json for tests/test_editor_nvim*.py, and failing with it.
--   local t = dofile(here .. '/harness.lua').new(out, scenario)
local M = {}

function M.new(out, scenario)
  local t = { record = { scenario = scenario } }

  --- Write the record (the Python side reads it whether the script passed or not).
  function t.save()
    local f = assert(io.open(out, 'w'))
    f:write(vim.json.encode(t.record))
    f:close()
  end

  --- Record `msg` as the error, save, and exit non-zero.
  function t.fail(msg)
    t.record.error = msg
    t.save()
    io.stderr:write('FAIL: ' .. msg .. '\n')
    os.exit(1)
  end

  function t.check(cond, msg)
    if not cond then
      t.fail(msg)
    end
  end

  function t.eq(got, want, what)
    if not vim.deep_equal(got, want) then
      t.fail(string.format('%s: got %s, want %s', what, vim.inspect(got), vim.inspect(want)))
    end
  end

  return t
end

return M
