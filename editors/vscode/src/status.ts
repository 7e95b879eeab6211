// Status bar item: model, server state, last tok/s and draft acceptance.
import * as vscode from 'vscode';

/** Payload of the server's `echoline/status` notification. */
export interface StatusParams {
  state?: 'loading' | 'ready' | 'error' | string;
  model?: string;
  message?: string;
  tokS?: number;
  acceptance?: number;
  /** engine `openai`: what the connect-time probe found (docs/team.md, "Exactness"). */
  exactness?: 'verified' | 'best-effort' | string;
  endpoint?: string;
  /** Which model does which job: job (`rewrite`, `inline`) -> its model, why, its state. */
  models?: Record<string, { model?: string; reason?: string; state?: string }>;
  /** The same in one line: `rewrite: qwen2.5-coder-1.5b (…) · inline: qwen2.5-coder-0.5b (…)`. */
  modelSummary?: string;
}

export function fmtRate(tokS?: number): string | undefined {
  return typeof tokS === 'number' && isFinite(tokS) ? `${tokS.toFixed(1)} tok/s` : undefined;
}

export function fmtAcceptance(a?: number): string | undefined {
  if (typeof a !== 'number' || !isFinite(a)) {
    return undefined;
  }
  // Accept a fraction (0..1) or a percentage.
  const pct = a <= 1 ? a * 100 : a;
  return `${pct.toFixed(0)}% accepted`;
}

export class StatusItem implements vscode.Disposable {
  private readonly item: vscode.StatusBarItem;
  private current: StatusParams = { state: 'loading' };
  private inline = true;

  /** `menuCommand`: what a click runs (the echoline menu). */
  constructor(menuCommand: string) {
    this.item = vscode.window.createStatusBarItem('echoline.status', vscode.StatusBarAlignment.Right, 100);
    this.item.name = 'echoline';
    this.item.command = menuCommand;
    this.render();
    this.item.show();
  }

  /** Show whether inline completions are on (off: a marker in the item). */
  setInline(enabled: boolean): void {
    this.inline = enabled;
    this.render();
  }

  /** Merge a partial update (status notification or rewrite stats) and redraw. */
  update(p: StatusParams): void {
    this.current = { ...this.current, ...Object.fromEntries(Object.entries(p).filter(([, v]) => v !== undefined && v !== null)) };
    this.render();
  }

  private render(): void {
    const s = this.current;
    const model = s.model ?? 'echoline';
    const icon = s.state === 'ready' ? '$(sparkle)' : s.state === 'error' ? '$(error)' : '$(sync~spin)';
    const parts = [`${icon} ${model}`];
    if (s.exactness) {
      // A shared inference server: whether its replies were seen to be exact.
      parts.push(s.exactness === 'verified' ? '$(verified) remote' : '$(warning) remote best-effort');
    }
    if (s.state === 'ready' && s.tokS) {
      // Figures of the last generation; none yet right after loading.
      parts.push(fmtRate(s.tokS) ?? '');
      const acc = fmtAcceptance(s.acceptance);
      if (acc) {
        parts.push(acc);
      }
    } else if (s.state) {
      // While loading, what the load is doing (downloading 12.0 / 469.0 MiB, compiling
      // kernels (first run only), calibrating draft lengths): the server's message.
      parts.push(s.state === 'loading' && s.message ? `loading (${s.message})` : s.state);
    }
    if (!this.inline) {
      parts.push('$(circle-slash) inline off');
    }
    this.item.text = parts.join(' · ');
    this.item.tooltip =
      `echoline ${s.state ?? ''}${s.message ? `: ${s.message}` : ''}` +
      (s.modelSummary ? `\nModels: ${s.modelSummary}` : '') +
      (s.exactness ? `\nInference server ${s.endpoint ?? ''}: exactness ${s.exactness}.` : '') +
      `\nInline completions ${this.inline ? 'on' : 'off'}.` +
      '\nClick for the menu: inline completions on/off, model, log, restart.';
    this.item.backgroundColor =
      s.state === 'error' ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
  }

  dispose(): void {
    this.item.dispose();
  }
}
