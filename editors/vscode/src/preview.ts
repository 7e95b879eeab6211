// Read-only virtual documents that hold a proposed rewrite, so it can be shown
// with VS Code's own diff editor before anything touches the real file.
import * as vscode from 'vscode';

export const PREVIEW_SCHEME = 'echoline-preview';

export class PreviewProvider implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly docs = new Map<string, string>();
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  private counter = 0;
  readonly onDidChange = this.changed.event;

  /** Store `text` under a fresh URI that keeps the original file name (for syntax colouring). */
  add(original: vscode.Uri, text: string): vscode.Uri {
    const name = original.path.split('/').pop() || 'untitled';
    const uri = vscode.Uri.from({ scheme: PREVIEW_SCHEME, path: `/${++this.counter}/${name}` });
    this.docs.set(uri.toString(), text);
    this.changed.fire(uri);
    return uri;
  }

  remove(uri: vscode.Uri): void {
    this.docs.delete(uri.toString());
  }

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.docs.get(uri.toString()) ?? '';
  }

  dispose(): void {
    this.docs.clear();
    this.changed.dispose();
  }
}

/** Apply `edits` (ranges in `doc`) to the document's text in memory. */
export function applyInMemory(doc: vscode.TextDocument, edits: readonly vscode.TextEdit[]): string {
  const text = doc.getText();
  const spans = edits
    .map((e) => ({ start: doc.offsetAt(e.range.start), end: doc.offsetAt(e.range.end), text: e.newText }))
    .sort((a, b) => b.start - a.start);
  let out = text;
  for (const s of spans) {
    out = out.slice(0, s.start) + s.text + out.slice(s.end);
  }
  return out;
}

/** Close any diff tab whose right-hand side is `previewUri`. */
export async function closePreviewTabs(previewUri: vscode.Uri): Promise<void> {
  const key = previewUri.toString();
  const tabs = vscode.window.tabGroups.all
    .flatMap((g) => g.tabs)
    .filter((t) => t.input instanceof vscode.TabInputTextDiff && t.input.modified.toString() === key);
  if (tabs.length > 0) {
    await vscode.window.tabGroups.close(tabs);
  }
}
