// "echoline: Check Setup": runs `echoline doctor --json` (derived from the server command,
// as the model picker's `models list` is) and shows its report as a Markdown document.
import { execFile } from 'child_process';
import * as vscode from 'vscode';
import { doctorCommand, serverSettings } from './config';

/** One check of `echoline doctor --json`. */
export interface SetupCheck {
  name: string;
  ok: boolean;
  required: boolean;
  detail: string;
}

/** The parts of the report this view reads (engine/setup_check.py writes them). */
export interface SetupReport {
  echoline?: string | null;
  python?: string;
  platform?: string;
  cpu?: string;
  cores?: number;
  backend?: string | null;
  checks: SetupCheck[];
  ok: boolean;
}

/** The report as Markdown: a verdict, then one row per check. */
export function renderReport(r: SetupReport, commandLine: string): string {
  const lines = [
    '# echoline set-up',
    '',
    r.ok ? '**Ready.**' : '**Not ready**: fix the checks marked FAIL.',
    '',
    `echoline ${r.echoline ?? '?'}, Python ${r.python ?? '?'}, ${r.platform ?? '?'}, ` +
      `${r.cpu ?? '?'} (${r.cores ?? '?'} cores); backend: ${r.backend ?? 'none'}`,
    '',
    '| | check | detail |',
    '|---|---|---|',
  ];
  for (const c of r.checks) {
    const mark = c.ok ? 'ok' : c.required ? 'FAIL' : 'warn';
    lines.push(`| ${mark} | ${c.name} | ${c.detail.replace(/\|/g, '\\|')} |`);
  }
  lines.push('', `From \`${commandLine}\`. Batch invariance on the real model: \`echoline doctor --invariance\`.`, '');
  return lines.join('\n');
}

/** The last line of stdout that is a JSON report (doctor prints its human form on stderr). */
export function parseReport(stdout: string): SetupReport | undefined {
  const lines = stdout.trim().split('\n');
  try {
    const r = JSON.parse(lines[lines.length - 1]) as SetupReport;
    return r && Array.isArray(r.checks) ? r : undefined;
  } catch {
    return undefined;
  }
}

/** Run the doctor and open its report beside the editor; failures go to the log. */
export async function checkSetup(log: vscode.LogOutputChannel, timeoutMs = 120000): Promise<void> {
  const { command, args } = doctorCommand(serverSettings().model);
  const commandLine = [command, ...args].join(' ');
  const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
  log.info(`check setup: ${commandLine}`);
  const text = await vscode.window.withProgress(
    { location: vscode.ProgressLocation.Notification, title: 'echoline: checking the set-up…' },
    () =>
      new Promise<string>((resolve) => {
        // doctor exits 1 when a required check fails: its report is on stdout all the same.
        execFile(command, args, { cwd, timeout: timeoutMs, maxBuffer: 4 << 20 }, (err, stdout, stderr) => {
          const report = parseReport(String(stdout));
          if (report) {
            resolve(renderReport(report, commandLine));
            return;
          }
          const why = err ? err.message.trim() : 'no report on stdout';
          log.warn(`${commandLine} failed (${why}); ${String(stderr).trim().slice(-500)}`);
          resolve(
            '# echoline set-up\n\n**The check could not run**: `' + commandLine + '` failed (' + why + ').\n\n' +
              'Is echoline installed where `echoline.command` or `echoline.pythonPath` points? ' +
              'See "echoline: Show Log".\n',
          );
        });
      }),
  );
  const doc = await vscode.workspace.openTextDocument({ content: text, language: 'markdown' });
  await vscode.window.showTextDocument(doc, { preview: true, viewColumn: vscode.ViewColumn.Beside });
}
