// Entry point: start `echoline serve` through vscode-languageclient, wire the
// status bar, the log channel, the rewrite command and the settings.
import * as vscode from 'vscode';
import {
  ClientCapabilities,
  DidChangeConfigurationNotification,
  Executable,
  FeatureState,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  StaticFeature,
} from 'vscode-languageclient/node';
import { changedServerKeys, inlineCompletionsEnabled, serverCommand, serverSettings } from './config';
import { CursorReporter, describeWarm, InlineWarmParams } from './cursor';
import { RewriteProgressParams, ServerEvents } from './events';
import { pickModel, showMenu, toggleInline } from './menu';
import { checkSetup } from './setup';
import { PREVIEW_SCHEME, PreviewProvider } from './preview';
import { Rewriter } from './rewrite';
import { StatusItem, StatusParams } from './status';
import { NextEditController } from './nextEdit';

let client: LanguageClient | undefined;

/**
 * Turns off server-initiated work-done progress. The rewrite command shows its own
 * notification (tok/s, acceptance, a Cancel button that sends $/cancelRequest) and
 * the status bar shows model loading, so the server's progress would only duplicate them.
 */
class NoServerProgress implements StaticFeature {
  fillClientCapabilities(capabilities: ClientCapabilities): void {
    if (capabilities.window) {
      capabilities.window.workDoneProgress = false;
    }
  }
  initialize(): void {}
  getState(): FeatureState {
    return { kind: 'static' };
  }
  clear(): void {}
}

function createClient(log: vscode.LogOutputChannel, events: ServerEvents, rewriter: () => Rewriter): LanguageClient {
  const { command, args } = serverCommand();
  const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
  // No `transport`: with TransportKind.stdio the client appends `--stdio`, which
  // `echoline serve` rejects; without it, stdio is used all the same.
  const exe: Executable = { command, args, options: { cwd } };
  const serverOptions: ServerOptions = { run: exe, debug: exe };
  log.info(`starting server: ${[command, ...args].join(' ')}`);

  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    initializationOptions: serverSettings(),
    outputChannel: log,
    middleware: {
      provideInlineCompletionItems: (document, position, context, token, next) =>
        inlineCompletionsEnabled() ? next(document, position, context, token) : undefined,
      // The server's code action "Rewrite with echoline…" carries an empty instruction:
      // route it through the interactive flow (input box, progress, preview).
      executeCommand: async (cmd, cmdArgs, next) => {
        const a = cmdArgs?.[0] as { uri?: string; range?: unknown; instruction?: unknown } | undefined;
        if (cmd === 'echoline.rewrite' && a?.uri && a.range && !(typeof a.instruction === 'string' && a.instruction)) {
          const c = client!;
          const uri = c.protocol2CodeConverter.asUri(a.uri);
          const range = c.protocol2CodeConverter.asRange(a.range as never);
          const editor = await vscode.window.showTextDocument(uri, { selection: range });
          return rewriter().run(editor, range);
        }
        return next(cmd, cmdArgs);
      },
    },
  };
  const c = new LanguageClient('echoline', 'echoline', serverOptions, clientOptions);
  c.registerFeature(new NoServerProgress());
  c.onNotification('echoline/status', (p: StatusParams) => {
    log.info(`status: ${p.state ?? ''} ${p.model ?? ''} ${p.message ?? ''}`);
    events.status.fire(p);
  });
  c.onNotification('echoline/rewriteProgress', (p: RewriteProgressParams) => events.rewriteProgress.fire(p));
  c.onNotification('echoline/inlineWarm', (p: InlineWarmParams) => {
    if (p.state !== 'started') {
      log.info(describeWarm(p));
    }
  });
  return c;
}

async function startClient(c: LanguageClient, status: StatusItem, log: vscode.LogOutputChannel): Promise<void> {
  try {
    await c.start();
    log.info('server started');
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    log.error(`could not start the server: ${msg}`);
    status.update({ state: 'error', message: msg });
    void vscode.window.showErrorMessage(
      `echoline: could not start the language server (${msg}). Set echoline.command or echoline.pythonPath.`,
    );
  }
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const log = vscode.window.createOutputChannel('echoline', { log: true });
  const events = new ServerEvents();
  const status = new StatusItem('echoline.menu');
  status.update({ model: serverSettings().model, state: 'loading' });
  status.setInline(inlineCompletionsEnabled());
  const preview = new PreviewProvider();
  const rewriter = new Rewriter(() => client, events, preview, status, log);
  const cursor = new CursorReporter(() => client, () => inlineCompletionsEnabled() && serverSettings().inlineWarm);
  const nextEdit = new NextEditController(
    () => client,
    () => serverSettings().nextEdit,
    () => serverSettings().nextEditDebounceMs,
    log,
  );
  context.subscriptions.push(log, events, status, preview, cursor, nextEdit);
  let lastPhase = '';
  context.subscriptions.push(
    vscode.workspace.registerTextDocumentContentProvider(PREVIEW_SCHEME, preview),
    events.status.event((p) => {
      status.update(p);
      // The load's phases in the log (once each, not every byte count of a download).
      const phase = p.state === 'loading' && p.message ? p.message.replace(/ [\d.,]+ \/ [\d.,]+ MiB$/, '') : '';
      if (phase && phase !== lastPhase) {
        log.info(`loading: ${phase}`);
      }
      lastPhase = phase;
    }),
    vscode.commands.registerCommand('echoline.showLog', () => log.show(true)),
    vscode.commands.registerCommand('echoline.rewriteSelection', () => rewriter.run(vscode.window.activeTextEditor)),
    vscode.commands.registerCommand('echoline.acceptRewrite', () => rewriter.resolvePreview(true)),
    vscode.commands.registerCommand('echoline.rejectRewrite', () => rewriter.resolvePreview(false)),
    vscode.commands.registerCommand('echoline.toggleInlineCompletions', () => toggleInline()),
    vscode.commands.registerCommand('echoline.predictNextEdit', () => nextEdit.request(vscode.window.activeTextEditor, true)),
    vscode.commands.registerCommand('echoline.acceptNextEdit', () => nextEdit.jumpOrAccept()),
    vscode.commands.registerCommand('echoline.dismissNextEdit', () => nextEdit.dismiss('dismissed')),
    vscode.commands.registerCommand('echoline.pickModel', () => pickModel(log)),
    vscode.commands.registerCommand('echoline.checkSetup', () => checkSetup(log)),
    vscode.commands.registerCommand('echoline.menu', () => showMenu(serverSettings().model)),
    vscode.commands.registerCommand('echoline.restart', async () => {
      // Recreate the client so a changed command/pythonPath takes effect.
      if (client) {
        await client.stop().catch(() => undefined);
      }
      status.update({ state: 'loading', model: serverSettings().model, message: 'restarting' });
      client = createClient(log, events, () => rewriter);
      await startClient(client, status, log);
      cursor.report();
    }),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration('echoline')) {
        log.info('settings changed');
      }
      if (e.affectsConfiguration('echoline.inlineCompletions')) {
        status.setInline(inlineCompletionsEnabled());
      }
      // Every server setting the extension has, whichever changed (the server keeps
      // the others as they are; it reports unknown keys as errors, so only these).
      const changed = changedServerKeys(e);
      if (client?.isRunning() && changed.length > 0) {
        const settings = serverSettings();
        log.info(`settings sent to the server (changed: ${changed.map((k) => `${k}=${JSON.stringify(settings[k])}`).join(', ')})`);
        void client.sendNotification(DidChangeConfigurationNotification.type, { settings: { echoline: settings } });
      }
      if (e.affectsConfiguration('echoline.command') || e.affectsConfiguration('echoline.pythonPath')) {
        void vscode.window
          .showInformationMessage('echoline: restart the server to use the new command?', 'Restart')
          .then((c) => (c ? vscode.commands.executeCommand('echoline.restart') : undefined));
      }
    }),
  );
  client = createClient(log, events, () => rewriter);
  await startClient(client, status, log);
  cursor.report(); // the editor open before the server started
}

export async function deactivate(): Promise<void> {
  if (client) {
    await client.stop().catch(() => undefined);
    client = undefined;
  }
}
