-- Defaults and the mapping from plugin options to the server's settings.
local M = {}

M.defaults = {
  -- Command that starts the language server; nil: `echoline serve` from PATH.
  cmd = nil,
  cmd_env = nil, -- extra environment for the server process (e.g. { PYTHONPATH = ... })
  cmd_cwd = nil, -- working directory of the server process
  -- Filetypes to attach to; nil or {} attaches to every normal file buffer.
  filetypes = nil,
  root_markers = { '.git', 'pyproject.toml', 'package.json' },
  -- Server settings (initializationOptions and workspace/didChangeConfiguration).
  -- 'qwen2.5-coder-0.5b' (edits and completion on a laptop CPU), 'qwen2.5-coder-1.5b'
  -- (better edits: GPU, Apple silicon or 4+ cores), 'smollm2' (tiny, quick tests),
  -- 'gemma3-270m' (base model, plain completion), or a path to a .gguf file.
  model = 'qwen2.5-coder-0.5b',
  backend = 'auto',
  cpu_activations = nil, -- cpu backend: 'auto' (server default: q8 with AVX-512 VNNI, else f32), 'q8' or 'f32'
  speculation = true,
  max_tokens = 256,
  -- Seconds a request waits for a model that is still loading (nil: the server's, 60).
  ready_timeout_s = nil,
  kv_budget_mb = nil,
  -- Prefill the edited file's part of the rewrite prompt while you pause (replies unchanged).
  prefill_on_idle = true,
  prefill_idle_ms = 400,
  -- Earlier replies the engine keeps as draft sources (0: none).
  reply_history = 4,
  -- Rewrite: preview as a diff and apply on accept; false applies directly.
  confirm = true,
  -- Inline completion (ghost text).
  ghost_text = true,
  auto_trigger = true,
  debounce_ms = 200,
  keymaps = {
    accept = '<Tab>', -- insert mode; falls through when no suggestion is shown
    dismiss = '<C-]>',
  },
  -- Progress messages while rewriting (vim.notify, throttled).
  notify_progress = true,
}

M.options = vim.deepcopy(M.defaults)

function M.set(opts)
  M.options = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  return M.options
end

--- The server's settings object (keys as the server spells them).
function M.server_settings(o)
  o = o or M.options
  return {
    model = o.model,
    backend = o.backend,
    cpuActivations = o.cpu_activations,
    speculation = o.speculation,
    maxTokens = o.max_tokens,
    kvBudgetMB = o.kv_budget_mb,
    prefillOnIdle = o.prefill_on_idle,
    prefillIdleMs = o.prefill_idle_ms,
    replyHistory = o.reply_history,
    readyTimeoutS = o.ready_timeout_s,
  }
end

function M.cmd(o)
  o = o or M.options
  if o.cmd and #o.cmd > 0 then
    return o.cmd
  end
  return { 'echoline', 'serve' }
end

return M
