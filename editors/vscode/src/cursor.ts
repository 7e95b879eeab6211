// Where the cursor rests, told to the server (`echoline/cursor`: the document, its
// version, the position), so the server can run the inline prompt there before the first
// keystroke: on a CPU the first completion at a new place would otherwise run the whole
// prompt (docs/sidecar.md, "Inline warm-up"). Sent only while inline completions are on,
// at most once per REST_MS of cursor movement; the server waits its own inlineWarmMs.
import * as vscode from 'vscode';
import type { LanguageClient } from 'vscode-languageclient/node';

const REST_MS = 100;

/** Payload of `echoline/inlineWarm`, the server's warm-up start and end. */
export interface InlineWarmParams {
  uri: string;
  state: string;
  runS?: number | null;
  detail?: { tokens?: number; cached?: number | null };
}

/** A one-line account of a finished warm-up, for the log channel. */
export function describeWarm(p: InlineWarmParams): string {
  const d = p.detail ?? {};
  return `inline warm-up ${p.state}: ${d.cached ?? '?'} of ${d.tokens ?? '?'} tokens cached in ${p.runS ?? '?'} s`;
}

export class CursorReporter implements vscode.Disposable {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private readonly subscriptions: vscode.Disposable[];

  constructor(
    private readonly client: () => LanguageClient | undefined,
    private readonly enabled: () => boolean,
  ) {
    this.subscriptions = [
      vscode.window.onDidChangeTextEditorSelection((e) => this.report(e.textEditor)),
      vscode.window.onDidChangeActiveTextEditor((e) => this.report(e)),
    ];
  }

  /** Send `editor`'s cursor once it has stayed put REST_MS (a newer call restarts the wait). */
  report(editor: vscode.TextEditor | undefined = vscode.window.activeTextEditor): void {
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    const scheme = editor?.document.uri.scheme;
    if (!editor || (scheme !== 'file' && scheme !== 'untitled') || !this.enabled()) {
      return;
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      const c = this.client();
      if (!c?.isRunning() || vscode.window.activeTextEditor !== editor) {
        return;
      }
      const doc = editor.document;
      const pos = editor.selection.active;
      void c.sendNotification('echoline/cursor', {
        textDocument: { uri: c.code2ProtocolConverter.asUri(doc.uri), version: doc.version },
        position: { line: pos.line, character: pos.character },
      });
    }, REST_MS);
  }

  dispose(): void {
    if (this.timer) {
      clearTimeout(this.timer);
    }
    this.subscriptions.forEach((d) => d.dispose());
  }
}
