-- Per-buffer one-shot timers, each call restarting the buffer's wait: inline suggestions
-- (ghost.lua), edit predictions (next_edit.lua) and the cursor report (cursor.lua) each
-- ask the server only once the user has paused, and each keeps one timer a buffer.
local M = {}

local Timers = {}
Timers.__index = Timers

--- A set of per-buffer timers (bufnr → uv timer).
function M.new()
  return setmetatable({ timers = {} }, Timers)
end

--- (Re)start `bufnr`'s wait: `fn()` runs on the main loop `ms` from now, unless a newer
--- start or stop comes first.
function Timers:start(bufnr, ms, fn)
  local t = self.timers[bufnr]
  if not t then
    t = vim.uv.new_timer()
    self.timers[bufnr] = t
  end
  t:stop()
  t:start(ms, 0, vim.schedule_wrap(fn))
end

--- Cancel `bufnr`'s wait (the timer is kept for the next start).
function Timers:stop(bufnr)
  local t = self.timers[bufnr]
  if t then
    t:stop()
  end
end

--- Cancel `bufnr`'s wait and free its timer (the buffer is gone or detached).
function Timers:close(bufnr)
  local t = self.timers[bufnr]
  if t then
    self.timers[bufnr] = nil
    t:stop()
    t:close()
  end
end

return M
