// "echoline: Rewrite Selection…": ask for an instruction, run `echoline.rewrite`
// on the server with a cancellable progress notification, then either preview the
// result as a diff (apply on accept) or let the server apply it directly.
import * as vscode from 'vscode';
import {
  ExecuteCommandRequest,
  LanguageClient,
  Range as LspRange,
  WorkDoneProgress,
  WorkspaceEdit as LspWorkspaceEdit,
} from 'vscode-languageclient/node';
import { confirmRewrites } from './config';
import type { RewriteProgressParams, ServerEvents } from './events';
import { applyInMemory, closePreviewTabs, PreviewProvider } from './preview';
import { fmtAcceptance, fmtRate, StatusItem } from './status';

/** The one argument of the server command `echoline.rewrite`. */
export interface RewriteArgs {
  uri: string;
  version: number;
  range: LspRange;
  instruction: string;
  mode: 'apply' | 'preview';
}

export interface RewriteResult {
  applied: boolean;
  reason?: string | null;
  text?: string;
  edit?: LspWorkspaceEdit;
  stats?: Record<string, unknown>;
}

export interface Stats {
  tokens?: number;
  tokS?: number;
  acceptance?: number;
}

function num(o: Record<string, unknown> | undefined, ...keys: string[]): number | undefined {
  for (const k of keys) {
    const v = o?.[k];
    if (typeof v === 'number' && isFinite(v)) {
      return v;
    }
  }
  return undefined;
}

/** Read the server's statistics whatever their spelling (camelCase or snake_case). */
export function readStats(o: Record<string, unknown> | undefined): Stats {
  return {
    tokens: num(o, 'tokens', 'generated_tokens', 'generatedTokens', 'n_tokens'),
    tokS: num(o, 'tokS', 'tokens_per_s', 'tok_s', 'tokensPerSecond', 'tokens_per_second'),
    acceptance: num(o, 'acceptance', 'acceptanceRate', 'acceptance_rate'),
  };
}

export function describeStats(s: Stats): string {
  return [s.tokens !== undefined ? `${s.tokens} tokens` : undefined, fmtRate(s.tokS), fmtAcceptance(s.acceptance)]
    .filter((x) => x)
    .join(', ');
}

let tokenCounter = 0;

export class Rewriter {
  constructor(
    private readonly client: () => LanguageClient | undefined,
    private readonly events: ServerEvents,
    private readonly preview: PreviewProvider,
    private readonly status: StatusItem,
    private readonly log: vscode.LogOutputChannel,
  ) {}

  /** Run the interactive flow on `editor`, over `range` or else its selection (or current line). */
  async run(editor: vscode.TextEditor | undefined, range?: vscode.Range): Promise<void> {
    const client = this.client();
    if (!editor) {
      void vscode.window.showWarningMessage('echoline: open a file and select the code to rewrite.');
      return;
    }
    if (!client || !client.isRunning()) {
      void vscode.window.showErrorMessage('echoline: the language server is not running (see "echoline: Show Log").');
      return;
    }
    const doc = editor.document;
    let target = range ?? editor.selection;
    if (target.isEmpty) {
      target = doc.lineAt(target.start.line).range;
    }
    const instruction = await vscode.window.showInputBox({
      title: 'echoline: Rewrite Selection',
      prompt: 'How should the selection change? (empty: let the model reproduce/tidy it)',
      placeHolder: 'e.g. add type hints',
      ignoreFocusOut: true,
    });
    if (instruction === undefined) {
      return;
    }
    const confirm = confirmRewrites();
    const args: RewriteArgs = {
      uri: client.code2ProtocolConverter.asUri(doc.uri),
      version: doc.version,
      range: client.code2ProtocolConverter.asRange(target),
      instruction,
      mode: confirm ? 'preview' : 'apply',
    };
    this.log.info(`rewrite ${args.uri} v${args.version} lines ${target.start.line + 1}-${target.end.line + 1} mode=${args.mode}`);

    let cancelled = false;
    let result: RewriteResult | undefined;
    try {
      result = await vscode.window.withProgress(
        { location: vscode.ProgressLocation.Notification, title: 'echoline: rewriting', cancellable: true },
        (progress, token) => {
          token.onCancellationRequested(() => {
            cancelled = true;
            this.log.info('rewrite cancelled by the user');
          });
          return this.request(client, args, token, (msg) => progress.report({ message: msg }));
        },
      );
    } catch (err) {
      if (cancelled) {
        void vscode.window.showInformationMessage('echoline: rewrite cancelled.');
      } else {
        this.log.error(`rewrite failed: ${String(err)}`);
        void vscode.window.showErrorMessage(`echoline: rewrite failed: ${err instanceof Error ? err.message : String(err)}`);
      }
      return;
    }
    if (cancelled || !result) {
      void vscode.window.showInformationMessage('echoline: rewrite cancelled.');
      return;
    }
    const stats = readStats(result.stats);
    this.status.update({ tokS: stats.tokS, acceptance: stats.acceptance });
    this.log.info(`rewrite done: applied=${result.applied} reason=${result.reason ?? ''} ${describeStats(stats)}`);
    this.log.info(`rewrite text: ${JSON.stringify(result.text ?? '')}`);

    if (!confirm) {
      if (result.applied) {
        void vscode.window.setStatusBarMessage(`echoline: rewrite applied (${describeStats(stats)})`, 5000);
      } else {
        void vscode.window.showWarningMessage(`echoline: rewrite not applied: ${result.reason ?? 'unknown reason'}`);
      }
      return;
    }
    await this.previewAndApply(client, doc, target, args.version, result, stats);
  }

  /** Send the command with a work-done token; stream progress from `$/progress` and `echoline/rewriteProgress`. */
  private async request(
    client: LanguageClient,
    args: RewriteArgs,
    token: vscode.CancellationToken,
    report: (message: string) => void,
  ): Promise<RewriteResult> {
    const workDoneToken = `echoline-rewrite-${process.pid}-${++tokenCounter}`;
    const subs: vscode.Disposable[] = [
      client.onProgress(WorkDoneProgress.type, workDoneToken, (v) => {
        if (v.kind !== 'end' && v.message) {
          report(v.message);
        }
      }),
      this.events.rewriteProgress.event((p: RewriteProgressParams) => {
        if (p.uri === args.uri) {
          report(describeStats(p) || 'generating…');
          this.status.update({ tokS: p.tokS, acceptance: p.acceptance });
        }
      }),
    ];
    try {
      report('starting…');
      return (await client.sendRequest(
        ExecuteCommandRequest.type,
        { command: 'echoline.rewrite', arguments: [args], workDoneToken },
        token,
      )) as RewriteResult;
    } finally {
      subs.forEach((d) => d.dispose());
    }
  }

  /** The pending preview's decision: accept (true) or reject (false). */
  private decide: ((accept: boolean) => void) | undefined;

  /** Whether a rewrite preview is waiting for Accept/Reject. */
  get previewing(): boolean {
    return this.decide !== undefined;
  }

  /** Accept (true) or reject (false) the rewrite shown in the preview; false if none is shown. */
  resolvePreview(accept: boolean): boolean {
    const d = this.decide;
    if (!d) {
      void vscode.window.setStatusBarMessage('echoline: no rewrite preview is open', 3000);
      return false;
    }
    d(accept);
    return true;
  }

  /**
   * Show the proposal in a diff editor; apply it only if the user accepts. No modal
   * dialog: the context key `echoline.previewActive` enables the Accept/Reject
   * commands (keybindings, editor title buttons); a notification names the keys and
   * its Cancel button rejects; closing the diff rejects too.
   */
  private async previewAndApply(
    client: LanguageClient,
    doc: vscode.TextDocument,
    target: vscode.Range,
    version: number,
    result: RewriteResult,
    stats: Stats,
  ): Promise<void> {
    let edit: vscode.WorkspaceEdit;
    if (result.edit) {
      edit = await client.protocol2CodeConverter.asWorkspaceEdit(result.edit);
    } else {
      edit = new vscode.WorkspaceEdit();
      edit.replace(doc.uri, target, result.text ?? '');
    }
    const edits = edit.get(doc.uri);
    const proposed = applyInMemory(doc, edits);
    if (proposed === doc.getText()) {
      void vscode.window.showInformationMessage('echoline: the model proposed no change.');
      return;
    }
    // A preview still open from an earlier rewrite is rejected.
    this.decide?.(false);
    const previewUri = this.preview.add(doc.uri, proposed);
    const name = doc.uri.path.split('/').pop();
    let settle: (accept: boolean) => void = () => undefined;
    const decision = new Promise<boolean>((resolve) => (settle = resolve));
    const decide = (accept: boolean): void => {
      if (this.decide === decide) {
        this.decide = undefined;
      }
      settle(accept);
    };
    this.decide = decide;
    const subs: vscode.Disposable[] = [
      vscode.window.tabGroups.onDidChangeTabs((e) => {
        const key = previewUri.toString();
        if (e.closed.some((t) => t.input instanceof vscode.TabInputTextDiff && t.input.modified.toString() === key)) {
          decide(false);
        }
      }),
    ];
    await vscode.commands.executeCommand('setContext', 'echoline.previewActive', true);
    await vscode.commands.executeCommand('vscode.diff', doc.uri, previewUri, `${name} ↔ echoline rewrite`, {
      preview: false, // a pinned tab: opening another file does not close (reject) it
      selection: target,
    });
    const mac = process.platform === 'darwin';
    const keys = `Accept: ${mac ? '⌥⌘Enter' : 'Ctrl+Alt+Enter'} · Reject: Escape`;
    void vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: 'echoline: review the rewrite', cancellable: true },
      (progress, token) => {
        progress.report({ message: `${describeStats(stats)}. ${keys} (or the ✓/✕ buttons above the diff)` });
        token.onCancellationRequested(() => decide(false));
        return decision;
      },
    );
    const accepted = await decision;
    subs.forEach((d) => d.dispose());
    if (!this.decide) {
      await vscode.commands.executeCommand('setContext', 'echoline.previewActive', false);
    }
    await closePreviewTabs(previewUri);
    this.preview.remove(previewUri);
    if (!accepted) {
      this.log.info('rewrite rejected');
      return;
    }
    if (doc.version !== version) {
      void vscode.window.showWarningMessage('echoline: the file changed while rewriting; run the rewrite again.');
      return;
    }
    const ok = await vscode.workspace.applyEdit(edit);
    this.log.info(`rewrite accepted, applied=${ok}`);
    if (!ok) {
      void vscode.window.showErrorMessage('echoline: could not apply the rewrite.');
    }
  }
}
