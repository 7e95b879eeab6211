// Drives a real VS Code (code-server) in headless Chromium through the echoline
// extension: wait for activation, trigger and commit an inline suggestion, save,
// then rewrite a line range from the command palette and save again; then a rewrite
// in preview mode (ctrl+alt+r, accepted with ctrl+alt+enter), the status bar menu
// and its model list, and the inline completions toggle.
// Run by tests/test_editor_vscode.py; every input comes from the environment and
// the findings go to E2E_OUT as JSON (the Python test checks the file on disk).
'use strict';
const fs = require('fs');
const path = require('path');
const { stepper, extensionLog, waiter, palette, openFile, gotoLine, drive } = require('./e2e_common.cjs');

const env = process.env;
const out = { steps: [] };
const TIMEOUT = Number(env.E2E_TIMEOUT_MS || 240000);
const file = path.join(env.E2E_WORKSPACE, env.E2E_FILE);
const step = stepper(out);
const waitFor = waiter(TIMEOUT, 250);

async function statusText(page) {
  const item = page.locator('.statusbar-item', { hasText: env.E2E_MODEL || 'smollm2' }).first();
  return (await item.count()) ? (await item.innerText()).trim() : '';
}

async function main(page) {
  step('workbench');

  // Activation: the status bar item appears, then reports the model as ready.
  await waitFor('the echoline status bar item', () => statusText(page), 90000);
  step('activated', { status: await statusText(page) });
  out.activated = true;

  await openFile(page, env.E2E_FILE);
  step('opened');
  const ready = await waitFor('the model to be ready', async () => {
    const s = await statusText(page);
    return s && !/loading|error/.test(s) ? s : '';
  });
  // The load was shown (its phases reached the status bar and the log) and raised no
  // error notification while it ran.
  out.loadLog = extensionLog().split('\n').filter((l) => /loading: /.test(l));
  out.errorToastsAtReady = await page.locator('.notification-toast .codicon-error').count();
  step('ready', { status: ready, load: out.loadLog.length });

  // --- inline suggestion: trigger, see the ghost text, commit ---------------
  if (env.E2E_GHOST_LINE) {
    const warmsBefore = extensionLog().split('inline warm-up done').length;
    await gotoLine(page, Number(env.E2E_GHOST_LINE), true);
    // The cursor's new place reached the server (echoline/cursor), which ran the inline
    // prompt there ahead of any keystroke and said so (echoline/inlineWarm, in the log).
    try {
      await waitFor('an inline warm-up', async () => extensionLog().split('inline warm-up done').length > warmsBefore,
        60000, 200);
    } catch (e) {
      step('no inline warm-up', { error: e.message });
    }
    out.warmLog = extensionLog().split('\n').filter((l) => /inline warm-up/.test(l));
    out.warmsAtGhostLine = extensionLog().split('inline warm-up done').length - warmsBefore;
    // Delete the end of the line so that there is something obvious to complete.
    for (let i = 0; i < Number(env.E2E_GHOST_BACKSPACE || 0); i++) await page.keyboard.press('Backspace');
    if (env.E2E_GHOST_TYPE) await page.keyboard.type(env.E2E_GHOST_TYPE);
    await palette(page, 'Trigger Inline Suggestion');
    const ghost = page.locator('.monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text-decoration-preview, .monaco-editor .ghost-text');
    await ghost.first().waitFor({ state: 'visible', timeout: TIMEOUT });
    const parts = await ghost.allInnerTexts();
    out.ghostText = parts.join('\n').replace(/\u00a0/g, ' ');
    if (env.E2E_GHOST_SCREENSHOT) await page.screenshot({ path: env.E2E_GHOST_SCREENSHOT });
    step('ghost shown', { ghost: out.ghostText });
    // Typing through it: each typed character the start of the ghost text, the rest
    // stays on screen (read after each keystroke and after the server's answer).
    out.typeThrough = [];
    const through = Math.min(Number(env.E2E_GHOST_TYPE_THROUGH || 0), out.ghostText.split('\n')[0].length - 1);
    for (let i = 0; i < through; i++) {
      await page.keyboard.type(out.ghostText[i]);
      // one rendered frame after the key (a read in the key's own task can race the
      // editor's re-render and see the text from before it)
      await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
      const now = (await ghost.allInnerTexts()).join('\n').replace(/\u00a0/g, ' ');
      await page.waitForTimeout(400);
      const later = (await ghost.allInnerTexts()).join('\n').replace(/\u00a0/g, ' ');
      out.typeThrough.push({ typed: out.ghostText.slice(0, i + 1), now, later });
    }
    if (through > 0) step('typed through', { steps: out.typeThrough });
    await page.keyboard.press('Tab');
    await waitFor('the ghost text to be committed', async () => (await ghost.count()) === 0, 10000);
    await page.keyboard.press('Control+S');
    await waitFor('the saved file', async () => (await page.locator('.tab.dirty').count()) === 0, 15000);
    out.afterGhost = fs.readFileSync(file, 'utf8');
    step('ghost committed');
  }
  // --- rewrite through the command palette ---------------------------------
  const l1 = Number(env.E2E_LINE1), l2 = Number(env.E2E_LINE2);
  await gotoLine(page, l1, false);
  for (let i = l1; i <= l2; i++) await page.keyboard.press('Shift+ArrowDown');
  await palette(page, 'echoline: Rewrite Selection');
  const box = page.locator('.quick-input-widget input');
  await box.waitFor({ state: 'visible', timeout: 15000 });
  await box.fill(env.E2E_INSTRUCTION || '');
  const before = extensionLog().split('rewrite done').length;
  await page.keyboard.press('Enter');
  step('rewrite requested');
  // Progress notification with tok/s while generating.
  try {
    const toast = page.locator('.notification-toast', { hasText: 'echoline: rewriting' }).first();
    await toast.waitFor({ state: 'visible', timeout: 30000 });
    await waitFor('tok/s in the progress', async () => /tok\/s/.test(await toast.innerText().catch(() => '')), 60000, 100);
    out.progressText = (await toast.innerText()).trim();
    if (env.E2E_PROGRESS_SCREENSHOT) await page.screenshot({ path: env.E2E_PROGRESS_SCREENSHOT });
  } catch (e) {
    out.progressText = `not seen: ${e.message}`;
  }
  await waitFor('the rewrite to finish', () => extensionLog().split('rewrite done').length > before, TIMEOUT, 200);
  const log = extensionLog();
  out.rewriteLog = log.split('\n').filter((l) => /rewrite (done|text)/.test(l));
  step('rewrite done');
  await page.waitForTimeout(500); // let the applied edit render
  await page.keyboard.press('Control+S');
  await waitFor('the saved file', async () => (await page.locator('.tab.dirty').count()) === 0, 15000);
  out.afterRewrite = fs.readFileSync(file, 'utf8');
  out.status = await statusText(page);
  if (env.E2E_SCREENSHOT) await page.screenshot({ path: env.E2E_SCREENSHOT });
  step('rewrite saved', { status: out.status });

  // --- rewrite with preview: diff editor + modal, accept -----------------------
  if (env.E2E_PREVIEW_LINE1) {
    // Switch echoline.rewrite.confirm on through VS Code's own settings editor
    // (a write to settings.json behind its back is not noticed reliably).
    const settingsFile = path.join(env.E2E_USER_DATA, 'User', 'settings.json');
    const settings = JSON.parse(fs.readFileSync(settingsFile, 'utf8'));
    settings['echoline.rewrite.confirm'] = true;
    // Server settings beyond the first six must reach the running server too.
    settings['echoline.replyHistory'] = 3;
    settings['echoline.prefillIdleMs'] = 300;
    const seen = extensionLog().split('settings changed').length;
    const sent = extensionLog().split('settings sent to the server').length;
    await palette(page, 'Preferences: Open User Settings (JSON)');
    // A tab in older versions, a modal editor in newer ones: wait for its text.
    await page.locator('.monaco-editor', { hasText: 'echoline.rewrite.confirm' }).last()
      .waitFor({ state: 'visible', timeout: 15000 });
    await page.waitForTimeout(500);
    await page.keyboard.press('Control+A');
    await page.keyboard.insertText(JSON.stringify(settings, null, 2));
    // Whatever the editor added after the cursor (an auto-closed brace) goes.
    await page.keyboard.press('Control+Shift+End');
    await page.keyboard.press('Delete');
    await page.keyboard.press('Control+S');
    await waitFor('the settings change', () => extensionLog().split('settings changed').length > seen, 30000);
    JSON.parse(fs.readFileSync(settingsFile, 'utf8')); // still valid JSON (VS Code refuses to write into a broken one)
    await waitFor('the settings sent to the server', () => extensionLog().split('settings sent to the server').length > sent, 30000);
    out.settingsSent = extensionLog().split('\n').filter((l) => /settings sent to the server/.test(l)).slice(-1)[0];
    await page.keyboard.press('Control+W');
    await openFile(page, env.E2E_FILE);
    const p1 = Number(env.E2E_PREVIEW_LINE1), p2 = Number(env.E2E_PREVIEW_LINE2);
    await gotoLine(page, p1, false);
    for (let i = p1; i <= p2; i++) await page.keyboard.press('Shift+ArrowDown');
    // The keybinding this time (ctrl+alt+r with a selection).
    await page.keyboard.press('Control+Alt+KeyR');
    const box2 = page.locator('.quick-input-widget input');
    await box2.waitFor({ state: 'visible', timeout: 15000 });
    await box2.fill(env.E2E_PREVIEW_INSTRUCTION || '');
    await page.keyboard.press('Enter');
    step('preview requested');
    // No modal: a notification names the keys; Ctrl+Alt+Enter accepts (context key echoline.previewActive).
    const review = page.locator('.notification-toast', { hasText: 'echoline: review the rewrite' });
    const noChange = page.locator('.notification-toast', { hasText: 'proposed no change' });
    await waitFor('the preview (or "no change")', async () =>
      (await review.isVisible().catch(() => false)) || (await noChange.isVisible().catch(() => false)), TIMEOUT);
    if (await review.isVisible()) {
      await page.locator('.monaco-diff-editor').first().waitFor({ state: 'visible', timeout: 15000 });
      out.previewNotification = (await review.innerText()).trim();
      out.modalDialogs = await page.locator('.monaco-dialog-box').count();
      await page.waitForTimeout(500);
      if (env.E2E_PREVIEW_SCREENSHOT) await page.screenshot({ path: env.E2E_PREVIEW_SCREENSHOT });
      step('preview shown');
      const before = extensionLog().split('rewrite accepted').length;
      await page.keyboard.press('Control+Alt+Enter');
      await waitFor('the accepted rewrite', () => extensionLog().split('rewrite accepted').length > before, 15000);
      await waitFor('the preview to close', async () => (await page.locator('.monaco-diff-editor').count()) === 0, 15000);
      out.previewOutcome = 'accepted';
    } else {
      out.previewOutcome = 'no change';
    }
    await page.waitForTimeout(300);
    await page.keyboard.press('Control+S');
    await waitFor('the saved file', async () => (await page.locator('.tab.dirty').count()) === 0, 15000);
    out.afterPreview = fs.readFileSync(file, 'utf8');
    out.previewLog = extensionLog().split('\n').filter((l) => /rewrite (done|text|accepted)/.test(l)).slice(-3);
    step('preview accepted');
  }
  // --- status bar menu: Pick Model… lists the server's models ------------------
  if (env.E2E_MENU) {
    await page.locator('.statusbar-item', { hasText: env.E2E_MODEL || 'smollm2' }).first().click();
    const rows = page.locator('.quick-input-list .monaco-list-row');
    await rows.filter({ hasText: 'Pick Model' }).first().waitFor({ state: 'visible', timeout: 15000 });
    out.menuRows = (await rows.allInnerTexts()).map((t) => t.replace(/\s+/g, ' ').trim());
    await page.locator('.quick-input-widget input').fill('Pick Model');
    await page.waitForTimeout(200);
    await page.keyboard.press('Enter');
    // The list from `echoline models list --json` marks downloaded models.
    await waitFor('the model list', async () => (await rows.filter({ hasText: 'downloaded' }).count()) > 0, 60000);
    out.modelRows = (await rows.allInnerTexts()).map((t) => t.replace(/\s+/g, ' ').trim());
    await page.keyboard.press('Escape');
    await page.locator('.quick-input-widget').waitFor({ state: 'hidden', timeout: 15000 });
    step('menu and model list', { rows: out.modelRows.length });
    // --- toggle inline completions off and on again (the setting is written) ---
    const settingsFile = path.join(env.E2E_USER_DATA, 'User', 'settings.json');
    const inlineSetting = () => {
      try {
        return JSON.parse(fs.readFileSync(settingsFile, 'utf8'))['echoline.inlineCompletions'];
      } catch {
        return undefined;
      }
    };
    out.toggle = [];
    for (const want of [false, true]) {
      await palette(page, 'echoline: Toggle Inline Completions');
      await waitFor(`echoline.inlineCompletions = ${want}`, async () => inlineSetting() === want, 15000);
      await page.waitForTimeout(300);
      out.toggle.push({ setting: inlineSetting(), status: await statusText(page) });
    }
    step('toggled', { toggle: out.toggle });
    // --- Check Setup: the doctor's report opens as a Markdown document ----------
    await palette(page, 'echoline: Check Setup');
    const lines = page.locator('.monaco-editor .view-lines');
    const report = async () => {
      for (const t of await lines.allInnerTexts()) {
        const text = t.replace(/\u00a0/g, ' ');
        if (/echoline set-up/.test(text)) return text;
      }
      return '';
    };
    out.setupReport = await waitFor('the set-up report', report, 120000);
    if (env.E2E_SETUP_SCREENSHOT) await page.screenshot({ path: env.E2E_SETUP_SCREENSHOT });
    step('check setup');
  }
}

drive(out, main);
