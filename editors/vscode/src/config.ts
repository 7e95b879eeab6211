// Settings → server command line and initializationOptions.
// Kept apart from the client wiring so the mapping is in one place.
import * as vscode from 'vscode';

/**
 * Every `echoline.*` setting that is also a server setting (docs/sidecar.md, "Settings").
 * They go to the server in initializationOptions and, whenever one of them changes,
 * in workspace/didChangeConfiguration. tests/test_editor_static.py checks this list
 * against package.json and sidecar/config.py.
 */
export const SERVER_KEYS = [
  'model',
  'rewriteModel',
  'inlineModel',
  'backend',
  'cpuActivations',
  'speculation',
  'maxTokens',
  'inlineMaxTokens',
  'inlineSuffixTokens',
  'inlineWarm',
  'inlineWarmMs',
  'kvBudgetMB',
  'readyTimeoutS',
  'prefillOnIdle',
  'prefillIdleMs',
  'replyHistory',
  'engine',
  'endpoint',
  'serverKind',
  'apiKeyEnv',
  'nextEdit',
  'nextEditDebounceMs',
  'nextEditPredictor',
] as const;

export type ServerKey = (typeof SERVER_KEYS)[number];

/** Keys the server understands in initializationOptions and didChangeConfiguration. */
export interface ServerSettings {
  model: string; // 'auto': each job's default on this machine
  rewriteModel: string | null; // null: model
  inlineModel: string | null; // null: model
  backend: string;
  cpuActivations: string | null; // null: the server's default (auto); sent so a reset reaches it
  speculation: boolean;
  maxTokens: number;
  inlineMaxTokens: number;
  inlineSuffixTokens: number | null; // null: sized by the server to its prefill speed
  inlineWarm: boolean; // run the inline prompt at a resting cursor (echoline/cursor)
  inlineWarmMs: number;
  kvBudgetMB: number | null; // null: the server's choice; sent so a reset reaches it
  readyTimeoutS: number;
  prefillOnIdle: boolean;
  prefillIdleMs: number;
  replyHistory: number;
  engine: string; // 'local' or 'openai' (a shared inference server: docs/team.md)
  endpoint: string | null;
  serverKind: string;
  apiKeyEnv: string; // the variable's name; the key never leaves the environment
  nextEdit: boolean; // edit predictions (echoline/nextEdit after a pause)
  nextEditDebounceMs: number; // the pause after an edit before a prediction is asked
  nextEditPredictor: string; // 'repeat' (no model), 'model' or 'both'
}

/** The models `echoline models list` knows (used when that command cannot run). */
export const KNOWN_MODELS = ['qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b', 'smollm2', 'gemma3-270m'];

export function section(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration('echoline');
}

/** The settings the server reads; the defaults are package.json's (the server's own). */
export function serverSettings(): ServerSettings {
  const cfg = section();
  const budget = cfg.get<number | null>('kvBudgetMB', null);
  const suffix = cfg.get<number | null>('inlineSuffixTokens', null);
  return {
    model: cfg.get<string>('model', 'auto'),
    rewriteModel: cfg.get<string | null>('rewriteModel', null) || null,
    inlineModel: cfg.get<string | null>('inlineModel', null) || null,
    backend: cfg.get<string>('backend', 'auto'),
    cpuActivations: cfg.get<string | null>('cpuActivations', null),
    speculation: cfg.get<boolean>('speculation', true),
    maxTokens: cfg.get<number>('maxTokens', 512),
    inlineMaxTokens: cfg.get<number>('inlineMaxTokens', 64),
    inlineSuffixTokens: typeof suffix === 'number' ? suffix : null,
    inlineWarm: cfg.get<boolean>('inlineWarm', true),
    inlineWarmMs: cfg.get<number>('inlineWarmMs', 300),
    kvBudgetMB: typeof budget === 'number' ? budget : null,
    readyTimeoutS: cfg.get<number>('readyTimeoutS', 60),
    prefillOnIdle: cfg.get<boolean>('prefillOnIdle', true),
    prefillIdleMs: cfg.get<number>('prefillIdleMs', 400),
    replyHistory: cfg.get<number>('replyHistory', 4),
    engine: cfg.get<string>('engine', 'local'),
    endpoint: cfg.get<string | null>('endpoint', null),
    serverKind: cfg.get<string>('serverKind', 'llama'),
    apiKeyEnv: cfg.get<string>('apiKeyEnv', 'ECHOLINE_API_KEY'),
    nextEdit: cfg.get<boolean>('nextEdit', false),
    nextEditDebounceMs: cfg.get<number>('nextEditDebounceMs', 150),
    nextEditPredictor: cfg.get<string>('nextEditPredictor', 'repeat'),
  };
}

/** The server keys a configuration change touches (empty: nothing to send). */
export function changedServerKeys(e: vscode.ConfigurationChangeEvent): ServerKey[] {
  return SERVER_KEYS.filter((k) => e.affectsConfiguration(`echoline.${k}`));
}

/** Command and arguments that start `echoline serve` (stdio). */
export function serverCommand(): { command: string; args: string[] } {
  const cfg = section();
  const full = cfg.get<string[]>('command', []).filter((s) => s.length > 0);
  if (full.length > 0) {
    return { command: full[0], args: full.slice(1) };
  }
  const python = cfg.get<string>('pythonPath', '').trim();
  if (python) {
    return { command: python, args: ['-m', 'echoline', 'serve'] };
  }
  return { command: 'echoline', args: ['serve'] };
}

/**
 * Another `echoline` subcommand, derived from the server command by putting `tail` where
 * `serve` was: `<python> -m echoline serve` becomes `<python> -m echoline models list --json`.
 */
export function cliCommand(tail: string[]): { command: string; args: string[] } {
  const { command, args } = serverCommand();
  const serve = args.lastIndexOf('serve');
  return { command, args: [...(serve >= 0 ? args.slice(0, serve) : args), ...tail] };
}

/** The command that prints the known models as JSON (`echoline models list --json`). */
export function modelsListCommand(): { command: string; args: string[] } {
  return cliCommand(['models', 'list', '--json']);
}

/** The set-up report for the configured model, as JSON (`echoline doctor --json`). */
export function doctorCommand(model: string): { command: string; args: string[] } {
  return cliCommand(['doctor', '--json', '--model', model]);
}

export function confirmRewrites(): boolean {
  return section().get<boolean>('rewrite.confirm', true);
}

export function inlineCompletionsEnabled(): boolean {
  return section().get<boolean>('inlineCompletions', true);
}

/** The workspace settings when the user set `key` there, else the user settings. */
export function targetFor(key: string): vscode.ConfigurationTarget {
  const i = section().inspect(key);
  if (i?.workspaceValue !== undefined) {
    return vscode.ConfigurationTarget.Workspace;
  }
  return vscode.ConfigurationTarget.Global;
}
