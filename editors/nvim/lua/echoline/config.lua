-- Defaults and the mapping from plugin options to the server's settings.
local M = {}

M.defaults = {
  -- Command that starts the language server; nil: `echoline serve` from PATH.
  cmd = nil,
  cmd_env = nil, -- extra environment for the server process (e.g. { PYTHONPATH = ... })
  cmd_cwd = nil, -- working directory of the server process
  -- Filetypes to attach to; nil or {} attaches to every normal file buffer.
  filetypes = nil,
  -- Start the client from setup() (FileType autocmd). false: you start it yourself,
  -- e.g. with vim.lsp.enable('echoline') on 0.11+ (lsp/echoline.lua).
  autostart = true,
  root_markers = { '.git', 'pyproject.toml', 'package.json' },
  -- Server settings (initializationOptions and workspace/didChangeConfiguration).
  -- The model of both jobs (rewrites; inline completion and edit prediction): 'auto' (each
  -- job's default here: rewrites get 'qwen2.5-coder-1.5b' where this machine runs it fast
  -- enough, else 'qwen2.5-coder-0.5b'; inline gets 'qwen2.5-coder-0.5b'), a name
  -- ('qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b', 'smollm2' (tiny, quick tests),
  -- 'gemma3-270m' (base model, plain completion)), or a path to a .gguf file.
  -- `echoline doctor` says which model does what and why.
  model = 'auto',
  rewrite_model = nil, -- rewrites' own model (nil: model); 'auto': the machine's choice
  inline_model = nil, -- inline completion's and edit prediction's own model (nil: model)
  backend = 'auto',
  cpu_activations = nil, -- cpu backend: 'auto' (server default: q8 with AVX2 or better, else f32), 'q8' or 'f32'
  speculation = true,
  max_tokens = 512, -- longest rewrite (the server's default)
  inline_max_tokens = 64, -- longest inline completion (the server's default)
  -- Tokens after the cursor an inline prompt carries; nil: the server sizes them to its
  -- prefill speed (each keystroke's request runs them again); 0: none.
  inline_suffix_tokens = nil,
  -- Run the inline prompt where the cursor rests, before the first keystroke there (the
  -- plugin reports the cursor; suggestions are identical either way).
  inline_warm = true,
  inline_warm_ms = 300, -- how long the cursor rests before the server starts
  -- Seconds a request waits for a model that is still loading (nil: the server's, 60).
  ready_timeout_s = nil,
  kv_budget_mb = nil,
  -- Prefill the edited file's part of the rewrite prompt while you pause (replies unchanged).
  prefill_on_idle = true,
  prefill_idle_ms = 400,
  -- Earlier replies the engine keeps as draft sources (0: none).
  reply_history = 4,
  -- A shared inference server instead of the in-process model (docs/team.md). nil: the
  -- server's ('local', or what `echoline serve --engine ... --endpoint ...` was given).
  engine = nil, -- 'local' or 'openai'
  endpoint = nil, -- engine 'openai': the server's URL, e.g. 'http://gpu-box:8000'
  server_kind = nil, -- 'llama' (server default), 'vllm', 'sglang' or 'openai'
  api_key_env = nil, -- the variable holding the API key (server default: ECHOLINE_API_KEY)
  -- Edit predictions: after a pause of next_edit_debounce_ms following an edit, the
  -- server predicts the next edit; it is drawn where it would happen (keymaps.next_edit
  -- jumps to it, then applies it). :EcholineNextEdit asks whatever this says.
  next_edit = false,
  next_edit_debounce_ms = 150,
  -- Who predicts: 'repeat' (your last change at its next place, no model), 'model', 'both'.
  next_edit_predictor = 'repeat',
  -- Rewrite: preview as a diff and apply on accept; false applies directly.
  confirm = true,
  -- Inline completion (ghost text).
  ghost_text = true,
  auto_trigger = true,
  debounce_ms = 200,
  -- Insert-mode keys. With no suggestion shown each falls through to what the key did
  -- before (your own mapping of it, e.g. a completion plugin's <Tab>, or the key itself).
  keymaps = {
    accept = '<Tab>', -- the whole suggestion
    accept_word = false, -- opt-in, e.g. '<M-Right>': its next word
    accept_line = false, -- opt-in, e.g. '<M-C-Right>': the rest of its current line
    dismiss = '<C-]>',
    -- Normal and insert mode: jump to the predicted edit, then apply it (with none shown
    -- the key does what it did before). Set '<Tab>' here to use Tab; false: no mapping.
    next_edit = '<M-n>',
    next_edit_dismiss = false, -- opt-in, normal mode (edits and cursor moves dismiss too)
  },
  -- Progress of a running rewrite in the message area: one line, replaced in place
  -- (at most every 250 ms; a progress message on 0.12+). The statusline shows it too.
  progress = true,
}

M.options = vim.deepcopy(M.defaults)

function M.set(opts)
  opts = vim.deepcopy(opts or {})
  -- Older name of `progress`.
  if opts.progress == nil and opts.notify_progress ~= nil then
    opts.progress = opts.notify_progress
  end
  opts.notify_progress = nil
  M.options = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts)
  return M.options
end

--- The server's settings object (keys as the server spells them).
function M.server_settings(o)
  o = o or M.options
  return {
    model = o.model,
    rewriteModel = o.rewrite_model,
    inlineModel = o.inline_model,
    backend = o.backend,
    cpuActivations = o.cpu_activations,
    speculation = o.speculation,
    maxTokens = o.max_tokens,
    inlineMaxTokens = o.inline_max_tokens,
    inlineSuffixTokens = o.inline_suffix_tokens,
    inlineWarm = o.inline_warm,
    inlineWarmMs = o.inline_warm_ms,
    kvBudgetMB = o.kv_budget_mb,
    prefillOnIdle = o.prefill_on_idle,
    prefillIdleMs = o.prefill_idle_ms,
    replyHistory = o.reply_history,
    readyTimeoutS = o.ready_timeout_s,
    engine = o.engine,
    endpoint = o.endpoint,
    serverKind = o.server_kind,
    apiKeyEnv = o.api_key_env,
    nextEdit = o.next_edit,
    nextEditDebounceMs = o.next_edit_debounce_ms,
    nextEditPredictor = o.next_edit_predictor,
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
