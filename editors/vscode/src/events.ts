// Fan-out for server notifications. The language client keeps one handler per
// method, so the extension registers each once and lets features subscribe here.
import * as vscode from 'vscode';
import type { StatusParams } from './status';

/** Payload of `echoline/rewriteProgress`, sent while a rewrite is generating. */
export interface RewriteProgressParams {
  uri: string;
  text?: string;
  tokens?: number;
  tokS?: number;
  acceptance?: number;
}

export class ServerEvents implements vscode.Disposable {
  readonly status = new vscode.EventEmitter<StatusParams>();
  readonly rewriteProgress = new vscode.EventEmitter<RewriteProgressParams>();

  dispose(): void {
    this.status.dispose();
    this.rewriteProgress.dispose();
  }
}
