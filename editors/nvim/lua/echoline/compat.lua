-- Small shims over Neovim API differences between 0.10, 0.11 and 0.12.
local M = {}

M.has_011 = vim.fn.has('nvim-0.11') == 1
M.has_012 = vim.fn.has('nvim-0.12') == 1

--- Send a request with the client's method syntax of this Neovim version.
---@return boolean ok, integer? request_id
function M.request(client, method, params, handler, bufnr)
  if M.has_011 then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

function M.cancel(client, id)
  if M.has_011 then
    return client:cancel_request(id)
  end
  return client.cancel_request(id)
end

function M.notify(client, method, params)
  if M.has_011 then
    return client:notify(method, params)
  end
  return client.notify(method, params)
end

--- LSP document version of a buffer: what didOpen/didChange last sent
--- (0 until the first change).
function M.buf_version(bufnr)
  return vim.lsp.util.buf_versions[bufnr] or 0
end

--- Byte column of an LSP `character` offset on a line, in the client's encoding.
function M.byte_col(line, character, encoding)
  if character <= 0 then
    return 0
  end
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col = pcall(vim.str_byteindex, line, encoding or 'utf-16', character, false)
  if ok and col then
    return col
  end
  ok, col = pcall(vim.str_byteindex, line, character, encoding ~= 'utf-32')
  return ok and col or math.min(character, #line)
end

--- LSP `character` offset of a byte column, in the client's encoding.
function M.char_col(line, byte, encoding)
  if encoding == 'utf-8' then
    return byte
  end
  local ok, idx = pcall(vim.str_utfindex, line, encoding or 'utf-16', byte, false)
  if ok and idx then
    return idx
  end
  local ok2, u32, u16 = pcall(vim.str_utfindex, line, byte)
  if ok2 then
    return encoding == 'utf-32' and u32 or u16
  end
  return byte
end

return M
