// Edit predictions: after the user pauses following an edit, ask the server for the
// next edit (`echoline/nextEdit`) and show it where it would happen. An insertion at
// the cursor is drawn as ghost-coloured text after the cursor; any other edit (a
// replacement, a deletion, an edit lines away) as decorations: the removed text struck
// through on a red background, the new text beside it on a green one. Tab jumps to the
// edit, then accepts it; Escape dismisses; both only while the context key
// `echoline.nextEditVisible` is set, so Tab keeps its meaning otherwise.
//
// Why decorations even for insertions: the stable InlineCompletionItem API would make
// the prediction compete with the FIM inline provider's items for one ghost text slot
// (and ask the model for a completion at the same time); one drawing path keeps the
// accept/version logic in one place. The prediction is tied to the document version it
// was computed for: shown only while the document is at that version, applied only if
// it still is (a stale one is dropped, never applied).
import * as vscode from 'vscode';
import type { LanguageClient } from 'vscode-languageclient/node';
import { Range as LspRange } from 'vscode-languageclient/node';

export const NEXT_EDIT_METHOD = 'echoline/nextEdit';
export const CONTEXT_KEY = 'echoline.nextEditVisible';
const CONTENT_MODIFIED = -32801;
const REQUEST_CANCELLED = -32800;

/** The answer of `echoline/nextEdit` (docs/sidecar.md). */
export interface NextEditResult {
  textDocument: { uri: string; version: number };
  edits: { range: LspRange; newText: string }[];
  id?: string;
}

interface Prediction {
  editor: vscode.TextEditor;
  version: number;
  edits: { range: vscode.Range; newText: string }[];
  id: string;
  /** Where the cursor was when asked (the cursor may rest there or on the edit). */
  anchor: vscode.Position;
  /** Tab moved the cursor to the edit; the next Tab accepts. */
  jumped: boolean;
}

/** One line of text for an after-decoration (line breaks shown as ⏎). */
export function oneLine(text: string): string {
  return text.replace(/\r?\n/g, '⏎');
}

export class NextEditController implements vscode.Disposable {
  private readonly removed = vscode.window.createTextEditorDecorationType({
    textDecoration: 'line-through',
    backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
    border: '1px solid',
    borderColor: new vscode.ThemeColor('diffEditor.removedTextBorder'),
  });
  private readonly added = vscode.window.createTextEditorDecorationType({
    after: {
      backgroundColor: new vscode.ThemeColor('diffEditor.insertedTextBackground'),
      border: '1px solid',
      borderColor: new vscode.ThemeColor('diffEditor.insertedTextBorder'),
      margin: '0 0 0 2px',
    },
  });
  private readonly ghost = vscode.window.createTextEditorDecorationType({
    after: { color: new vscode.ThemeColor('editorGhostText.foreground') },
  });
  private readonly hint = vscode.window.createTextEditorDecorationType({
    after: { color: new vscode.ThemeColor('editorGhostText.foreground'), margin: '0 0 0 2em' },
    isWholeLine: false,
  });
  private current: Prediction | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private pending: vscode.CancellationTokenSource | undefined;
  /** Our own cursor move or edit in progress: it must not dismiss what it acts on. */
  private busy = false;
  private readonly subscriptions: vscode.Disposable[];

  constructor(
    private readonly client: () => LanguageClient | undefined,
    private readonly enabled: () => boolean,
    private readonly debounceMs: () => number,
    private readonly log: vscode.LogOutputChannel,
  ) {
    this.subscriptions = [
      vscode.workspace.onDidChangeTextDocument((e) => this.onChange(e)),
      vscode.window.onDidChangeTextEditorSelection((e) => this.onSelection(e)),
      vscode.window.onDidChangeActiveTextEditor(() => this.dismiss('editor changed')),
      vscode.workspace.onDidCloseTextDocument((d) => {
        if (this.current?.editor.document === d) {
          this.dismiss('document closed');
        }
      }),
    ];
  }

  /** An edit: whatever is shown is out of date; ask again once the user pauses. */
  private onChange(e: vscode.TextDocumentChangeEvent): void {
    if (e.contentChanges.length === 0 || this.busy) {
      return;
    }
    const editor = vscode.window.activeTextEditor;
    if (this.current && this.current.editor.document === e.document) {
      this.dismiss('document changed');
    }
    if (!editor || editor.document !== e.document) {
      return;
    }
    this.cancelPending();
    if (this.enabled()) {
      this.schedule(editor);
    }
  }

  /** The cursor left both the place it was asked at and the edit: dismiss. */
  private onSelection(e: vscode.TextEditorSelectionChangeEvent): void {
    const cur = this.current;
    if (!cur || this.busy || e.textEditor !== cur.editor) {
      return;
    }
    const pos = e.selections[0]?.active;
    if (!pos) {
      return;
    }
    const first = cur.edits[0].range;
    if (pos.isEqual(cur.anchor) || first.contains(pos)) {
      return;
    }
    this.dismiss('cursor moved');
  }

  private schedule(editor: vscode.TextEditor): void {
    if (this.timer) {
      clearTimeout(this.timer);
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (vscode.window.activeTextEditor === editor) {
        void this.request(editor, false);
      }
    }, Math.max(0, this.debounceMs()));
  }

  private cancelPending(): void {
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    if (this.pending) {
      this.pending.cancel();
      this.pending.dispose();
      this.pending = undefined;
    }
  }

  /** Ask for a prediction at `editor`'s cursor now (`manual`: the command, which reports "none"). */
  async request(editor: vscode.TextEditor | undefined = vscode.window.activeTextEditor, manual = true): Promise<void> {
    const c = this.client();
    const scheme = editor?.document.uri.scheme;
    if (!editor || (scheme !== 'file' && scheme !== 'untitled')) {
      return;
    }
    if (!c?.isRunning()) {
      if (manual) {
        void vscode.window.showWarningMessage('echoline: the language server is not running.');
      }
      return;
    }
    this.cancelPending();
    this.dismiss(undefined);
    const doc = editor.document;
    const version = doc.version;
    const pos = editor.selection.active;
    const uri = c.code2ProtocolConverter.asUri(doc.uri);
    const source = new vscode.CancellationTokenSource();
    this.pending = source;
    this.log.info(`next edit requested: v${version} at ${pos.line + 1}:${pos.character + 1}`);
    let result: NextEditResult | null | undefined;
    try {
      result = await c.sendRequest<NextEditResult | null>(
        NEXT_EDIT_METHOD,
        { textDocument: { uri, version }, position: { line: pos.line, character: pos.character } },
        source.token,
      );
    } catch (err) {
      const code = (err as { code?: number })?.code;
      if (code === REQUEST_CANCELLED || source.token.isCancellationRequested) {
        return;
      }
      if (code === CONTENT_MODIFIED) {
        this.log.info(`next edit dropped: stale (the server has a newer version than v${version})`);
      } else {
        this.log.warn(`next edit failed: ${err instanceof Error ? err.message : String(err)}`);
      }
      return;
    } finally {
      if (this.pending === source) {
        this.pending = undefined;
      }
      source.dispose();
    }
    if (source.token.isCancellationRequested) {
      return;
    }
    const edits = result?.edits ?? [];
    const answered = result?.textDocument?.version;
    if (edits.length === 0) {
      this.log.info('next edit: none');
      if (manual) {
        void vscode.window.setStatusBarMessage('echoline: no edit predicted', 3000);
      }
      return;
    }
    // Shown only for the version it was computed for, in the editor it was asked for.
    if (answered !== version || doc.version !== version || vscode.window.activeTextEditor !== editor) {
      this.log.info(`next edit dropped: stale (answer for v${answered}, asked at v${version}, document at v${doc.version})`);
      return;
    }
    const converted = edits.map((e) => ({ range: c.protocol2CodeConverter.asRange(e.range), newText: e.newText }));
    this.show({ editor, version, edits: converted, id: result?.id ?? '', anchor: pos, jumped: false });
  }

  private isInsertionAtCursor(p: Prediction): boolean {
    return p.edits.length === 1 && p.edits[0].range.isEmpty && p.edits[0].range.start.isEqual(p.anchor);
  }

  private show(p: Prediction): void {
    this.current = p;
    const ed = p.editor;
    if (this.isInsertionAtCursor(p)) {
      ed.setDecorations(this.ghost, [
        { range: p.edits[0].range, renderOptions: { after: { contentText: oneLine(p.edits[0].newText) } } },
      ]);
    } else {
      ed.setDecorations(
        this.removed,
        p.edits.filter((e) => !e.range.isEmpty).map((e) => ({ range: e.range })),
      );
      ed.setDecorations(
        this.added,
        p.edits
          .filter((e) => e.newText !== '')
          .map((e) => ({
            range: new vscode.Range(e.range.end, e.range.end),
            renderOptions: { after: { contentText: oneLine(e.newText) } },
            hoverMessage: new vscode.MarkdownString().appendCodeblock(e.newText, ed.document.languageId),
          })),
      );
      const first = p.edits[0].range.start;
      if (first.line !== p.anchor.line) {
        // The edit is elsewhere: say so where the user is looking.
        const eol = ed.document.lineAt(p.anchor.line).range.end;
        ed.setDecorations(this.hint, [
          { range: new vscode.Range(eol, eol), renderOptions: { after: { contentText: `⇥ Tab: edit at line ${first.line + 1}` } } },
        ]);
      }
    }
    void vscode.commands.executeCommand('setContext', CONTEXT_KEY, true);
    const e = p.edits[0];
    this.log.info(
      `next edit shown: ${p.id} v${p.version} ${this.isInsertionAtCursor(p) ? 'insertion' : 'decoration'} ` +
        `at ${e.range.start.line + 1}:${e.range.start.character + 1}-${e.range.end.line + 1}:${e.range.end.character + 1} ` +
        `removes ${JSON.stringify(ed.document.getText(e.range))} adds ${JSON.stringify(e.newText)}`,
    );
  }

  /** Remove what is shown (`why`: logged; undefined: quietly). */
  dismiss(why: string | undefined): void {
    const p = this.current;
    if (!p) {
      return;
    }
    this.current = undefined;
    for (const t of [this.removed, this.added, this.ghost, this.hint]) {
      p.editor.setDecorations(t, []);
    }
    void vscode.commands.executeCommand('setContext', CONTEXT_KEY, false);
    if (why) {
      this.log.info(`next edit dismissed: ${why}`);
    }
  }

  /** Tab: move to the edit if the cursor is elsewhere, else apply it (same version only). */
  async jumpOrAccept(): Promise<void> {
    const p = this.current;
    if (!p) {
      await vscode.commands.executeCommand('tab');
      return;
    }
    const ed = p.editor;
    if (ed.document.version !== p.version) {
      this.log.info(`next edit not applied: stale (for v${p.version}, document at v${ed.document.version})`);
      this.dismiss(undefined);
      return;
    }
    const first = p.edits[0].range;
    const cursor = ed.selection.active;
    if (!p.jumped && !first.contains(cursor)) {
      this.busy = true;
      try {
        ed.selection = new vscode.Selection(first.start, first.start);
        ed.revealRange(first, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
      } finally {
        this.busy = false;
      }
      p.jumped = true;
      ed.setDecorations(this.hint, []);
      this.log.info(`next edit jumped to ${first.start.line + 1}:${first.start.character + 1}`);
      return;
    }
    // Where the cursor goes: after the last edit's new text, its offset moved by the
    // edits before it (the edits do not overlap and come in document order).
    const doc = ed.document;
    const last = p.edits[p.edits.length - 1];
    let endOffset = doc.offsetAt(last.range.start) + last.newText.length;
    for (const e of p.edits.slice(0, -1)) {
      endOffset += e.newText.length - (doc.offsetAt(e.range.end) - doc.offsetAt(e.range.start));
    }
    this.busy = true;
    let ok = false;
    try {
      ok = await ed.edit(
        (b) => {
          for (const e of p.edits) {
            b.replace(e.range, e.newText);
          }
        },
        { undoStopBefore: true, undoStopAfter: true },
      );
    } finally {
      this.busy = false;
    }
    this.dismiss(undefined);
    if (!ok) {
      this.log.warn('next edit not applied: the editor refused the edit');
      return;
    }
    const end = doc.positionAt(endOffset);
    ed.selection = new vscode.Selection(end, end);
    this.log.info(`next edit accepted: ${p.id} v${p.version} -> v${ed.document.version}`);
    // The accepted edit is an edit like any other: ask for the next one after the pause.
    if (this.enabled()) {
      this.schedule(ed);
    }
  }

  /** The shown prediction, for tests and the status bar. */
  get visible(): boolean {
    return this.current !== undefined;
  }

  dispose(): void {
    this.cancelPending();
    this.dismiss(undefined);
    this.subscriptions.forEach((d) => d.dispose());
    for (const t of [this.removed, this.added, this.ghost, this.hint]) {
      t.dispose();
    }
  }
}
