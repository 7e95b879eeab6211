-- What the headless test scripts (e2e.lua, units.lua, next_edit*.lua) share: the record
-- they write to OUT.json for tests/test_editor_nvim*.py, failing with it, and a script
-- run as a coroutine that sleeps between steps (so keys and autocmds go through the main
-- loop as they do for a user).
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

  local co

  --- Run `fn` as the script's coroutine; an error in it fails the test.
  function t.run(fn)
    co = coroutine.create(fn)
    local ok, err = coroutine.resume(co)
    if not ok then
      t.fail(tostring(err))
    end
  end

  --- Inside t.run: let the main loop run `ms`.
  function t.sleep(ms)
    vim.defer_fn(function()
      local ok, err = coroutine.resume(co)
      if not ok then
        t.fail(tostring(err))
      end
    end, ms)
    coroutine.yield()
  end

  --- Inside t.run: sleep `step` ms at a time until `cond()`; fail after `ms`.
  function t.wait(what, cond, ms, step)
    local t0 = vim.uv.now()
    while not cond() do
      if vim.uv.now() - t0 > ms then
        t.fail('timed out waiting for ' .. what)
      end
      t.sleep(step)
    end
  end

  return t
end

return M
