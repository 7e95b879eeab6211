// Settings → server command line and initializationOptions.
// Kept apart from the client wiring so the mapping is in one place.
import * as vscode from 'vscode';

/** Keys the server understands in initializationOptions and didChangeConfiguration. */
export interface ServerSettings {
  model: string;
  backend: string;
  cpuActivations: string | null; // null: the server's default (auto); sent so a reset reaches it
  speculation: boolean;
  maxTokens: number;
  kvBudgetMB?: number;
  prefillOnIdle: boolean;
  prefillIdleMs: number;
  replyHistory: number;
}

export function section(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration('echoline');
}

/** The settings the server reads, with null/undefined ones left out. */
export function serverSettings(): ServerSettings {
  const cfg = section();
  const out: ServerSettings = {
    model: cfg.get<string>('model', 'qwen2.5-coder-0.5b'),
    backend: cfg.get<string>('backend', 'auto'),
    cpuActivations: cfg.get<string | null>('cpuActivations', null),
    speculation: cfg.get<boolean>('speculation', true),
    maxTokens: cfg.get<number>('maxTokens', 256),
    prefillOnIdle: cfg.get<boolean>('prefillOnIdle', true),
    prefillIdleMs: cfg.get<number>('prefillIdleMs', 400),
    replyHistory: cfg.get<number>('replyHistory', 4),
  };
  const budget = cfg.get<number | null>('kvBudgetMB', null);
  if (typeof budget === 'number') {
    out.kvBudgetMB = budget;
  }
  return out;
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
    return { command: python, args: ['-m', 'sidecar', 'serve'] };
  }
  return { command: 'echoline', args: ['serve'] };
}

export function confirmRewrites(): boolean {
  return section().get<boolean>('rewrite.confirm', true);
}

export function inlineCompletionsEnabled(): boolean {
  return section().get<boolean>('inlineCompletions', true);
}
