-- Per-buffer requests in flight: inline suggestions (ghost.lua) and edit predictions
-- (next_edit.lua) each keep at most one a buffer, cancelled ($/cancelRequest) when a
-- newer one is asked or the user moves on, so the server never works for a stale cursor.
local compat = require('echoline.compat')

local M = {}

local Inflight = {}
Inflight.__index = Inflight

--- A set of per-buffer requests (bufnr → { client, id }).
function M.new()
  return setmetatable({ requests = {} }, Inflight)
end

--- `bufnr`'s request `id`, sent with `client`, is now in flight.
function Inflight:set(bufnr, client, id)
  self.requests[bufnr] = { client = client, id = id }
end

--- Whether a request of `bufnr` is in flight (`id`: that one).
function Inflight:has(bufnr, id)
  local p = self.requests[bufnr]
  return p ~= nil and (id == nil or p.id == id)
end

--- `bufnr`'s request was answered: forget it (`id`: only if it is that one).
function Inflight:done(bufnr, id)
  if self:has(bufnr, id) then
    self.requests[bufnr] = nil
  end
end

--- Cancel `bufnr`'s request in flight, if any.
function Inflight:cancel(bufnr)
  local p = self.requests[bufnr]
  if p then
    self.requests[bufnr] = nil
    pcall(compat.cancel, p.client, p.id)
  end
end

return M
