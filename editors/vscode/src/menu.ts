// The status bar menu (quick pick: inline completions on/off, model, rewrite, log,
// restart) and the model picker, whose names come from `echoline models list --json`.
import { execFile } from 'child_process';
import * as vscode from 'vscode';
import { inlineCompletionsEnabled, KNOWN_MODELS, modelsListCommand, section, targetFor } from './config';

/** One row of `echoline models list --json`. */
export interface ModelRow {
  name: string;
  description?: string;
  fits?: string;
  downloaded?: boolean;
  default?: boolean;
}

/** Run `echoline models list --json` (or its `python3 -m echoline` form); undefined when it fails. */
export function listModels(log: vscode.LogOutputChannel, timeoutMs = 30000): Promise<ModelRow[] | undefined> {
  const { command, args } = modelsListCommand();
  const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
  return new Promise((resolve) => {
    execFile(command, args, { cwd, timeout: timeoutMs, maxBuffer: 4 << 20 }, (err, stdout, stderr) => {
      if (err) {
        log.warn(`${[command, ...args].join(' ')} failed (${err.message.trim()}); ${String(stderr).trim().slice(-500)}`);
        resolve(undefined);
        return;
      }
      try {
        const lines = String(stdout).trim().split('\n');
        const rows = JSON.parse(lines[lines.length - 1]) as ModelRow[];
        resolve(Array.isArray(rows) ? rows.filter((r) => typeof r?.name === 'string') : undefined);
      } catch (e) {
        log.warn(`could not read the model list: ${String(e)}`);
        resolve(undefined);
      }
    });
  });
}

interface ModelItem extends vscode.QuickPickItem {
  model?: string;
  browse?: boolean;
}

/** Quick pick of the models; writes `echoline.model` (the server then loads it). */
export async function pickModel(log: vscode.LogOutputChannel): Promise<string | undefined> {
  const current = section().get<string>('model', 'qwen2.5-coder-0.5b');
  const qp = vscode.window.createQuickPick<ModelItem>();
  qp.title = 'echoline: Pick Model';
  qp.placeholder = `current: ${current}`;
  qp.busy = true;
  qp.matchOnDetail = true;
  const fallback: ModelItem[] = KNOWN_MODELS.map((name) => ({ label: name, model: name }));
  const browse: ModelItem = { label: '$(file) A .gguf file…', browse: true, alwaysShow: true };
  qp.items = [...fallback, browse];
  qp.show();
  const chosen = new Promise<ModelItem | undefined>((resolve) => {
    qp.onDidAccept(() => resolve(qp.selectedItems[0]));
    qp.onDidHide(() => resolve(undefined));
  });
  void listModels(log).then((rows) => {
    qp.busy = false;
    if (!rows) {
      qp.placeholder = `current: ${current} (the names echoline knows; \`echoline models list\` could not run, see the log)`;
      return;
    }
    qp.items = [
      ...rows.map((r) => ({
        label: r.name,
        model: r.name,
        description: [
          r.name === current ? 'current' : undefined,
          r.default ? 'default' : undefined,
          r.downloaded ? 'downloaded' : 'downloads on first use',
        ]
          .filter((x) => x)
          .join(' · '),
        detail: [r.description, r.fits ? `for: ${r.fits}` : undefined].filter((x) => x).join(' — '),
      })),
      browse,
    ];
  });
  const item = await chosen;
  qp.dispose();
  if (!item) {
    return undefined;
  }
  let model = item.model;
  if (item.browse) {
    const files = await vscode.window.showOpenDialog({
      title: 'echoline: a GGUF model file',
      canSelectMany: false,
      filters: { 'GGUF models': ['gguf'] },
    });
    model = files?.[0]?.fsPath;
  }
  if (!model || model === current) {
    return model;
  }
  await section().update('model', model, targetFor('model'));
  log.info(`model set to ${model}`);
  return model;
}

/** Turn inline completions on or off (the `echoline.inlineCompletions` setting). */
export async function toggleInline(enable?: boolean): Promise<boolean> {
  const on = enable ?? !inlineCompletionsEnabled();
  await section().update('inlineCompletions', on, targetFor('inlineCompletions'));
  if (!on) {
    await vscode.commands.executeCommand('editor.action.inlineSuggest.hide').then(undefined, () => undefined);
  }
  void vscode.window.setStatusBarMessage(`echoline: inline completions ${on ? 'on' : 'off'}`, 3000);
  return on;
}

interface MenuItem extends vscode.QuickPickItem {
  command?: string;
}

/** The items of the status bar menu, each with the command it runs. */
export function menuItems(inlineOn: boolean, model: string): MenuItem[] {
  return [
    {
      label: inlineOn ? '$(circle-slash) Disable Inline Completions' : '$(check) Enable Inline Completions',
      command: 'echoline.toggleInlineCompletions',
    },
    { label: '$(symbol-misc) Pick Model…', description: model, command: 'echoline.pickModel' },
    { label: '$(edit) Rewrite Selection…', command: 'echoline.rewriteSelection' },
    { label: '', kind: vscode.QuickPickItemKind.Separator },
    { label: '$(checklist) Check Setup', command: 'echoline.checkSetup' },
    { label: '$(output) Show Log', command: 'echoline.showLog' },
    { label: '$(debug-restart) Restart Server', command: 'echoline.restart' },
  ];
}

export async function showMenu(model: string): Promise<void> {
  const item = await vscode.window.showQuickPick(menuItems(inlineCompletionsEnabled(), model), {
    title: 'echoline',
    placeHolder: 'echoline: choose an action',
  });
  if (item?.command) {
    await vscode.commands.executeCommand(item.command);
  }
}
