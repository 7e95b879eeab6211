// Drives a real VS Code (code-server) in headless Chromium through the echoline
// extension's edit predictions, against the scripted server of
// tests/test_editor_vscode_next_edit.py (its rules say which edit is predicted when):
//   A. an edit on line 17, a pause: the predicted edit on line 18 is drawn as decorations
//      (struck-through old text, new text beside it, a Tab hint on line 17); Tab moves the
//      cursor there, Tab again applies it;
//   B. the next prediction (asked after the accept) dismissed with Escape; Tab then
//      does what Tab does (indents);
//   C. a prediction whose answer names another version than the document's is never shown;
//   D. "echoline: Predict Next Edit" from the palette: an insertion at the cursor, shown as
//      ghost text, accepted with one Tab.
// Findings go to E2E_OUT as JSON; the Python test checks the saved file on disk.
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require(process.env.PLAYWRIGHT_CORE || 'playwright-core');

const env = process.env;
const out = { steps: [] };
const file = path.join(env.E2E_WORKSPACE, env.E2E_FILE);

function step(name, extra) {
  out.steps.push({ name, t: Date.now(), ...extra });
  console.log(`[e2e] ${name}`);
}

function extensionLog() {
  const found = [];
  const walk = (d) => {
    for (const e of fs.existsSync(d) ? fs.readdirSync(d, { withFileTypes: true }) : []) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/echoline\.log$/.test(e.name)) found.push(p);
    }
  };
  walk(path.join(env.E2E_USER_DATA, 'logs'));
  return found.map((p) => fs.readFileSync(p, 'utf8')).join('\n');
}

/** Log lines about edit predictions. */
function nextLog() {
  return extensionLog().split('\n').filter((l) => /next edit/.test(l));
}

async function waitFor(what, fn, timeout = 30000, every = 100) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > timeout) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, every));
  }
}

/** Wait for a new log line matching `re` (after `from` lines); returns it. */
async function waitLog(what, re, from, timeout = 30000) {
  return waitFor(what, () => nextLog().slice(from).find((l) => re.test(l)), timeout);
}

async function palette(page, title) {
  await page.keyboard.press('F1');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible', timeout: 15000 });
  await input.fill('>' + title);
  const row = page.locator('.quick-input-list .monaco-list-row', { hasText: title }).first();
  await row.waitFor({ state: 'visible', timeout: 15000 });
  await page.keyboard.press('Enter');
  await page.locator('.quick-input-widget').waitFor({ state: 'hidden', timeout: 15000 });
}

async function openFile(page, name) {
  await page.keyboard.press('Control+P');
  const qi = page.locator('.quick-input-widget input');
  await qi.waitFor({ state: 'visible', timeout: 15000 });
  await qi.fill(name);
  await page.locator('.quick-input-list .monaco-list-row', { hasText: name }).first().waitFor({ state: 'visible', timeout: 15000 });
  await page.keyboard.press('Enter');
  await page.locator('.quick-input-widget').waitFor({ state: 'hidden', timeout: 15000 });
  await page.locator('.tab.active', { hasText: name }).first().waitFor({ state: 'visible', timeout: 15000 });
}

/** Cursor at column 1 of `line` (Quick Open's ":<line>"). */
async function gotoLine(page, line) {
  await page.keyboard.press('Control+P');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible', timeout: 15000 });
  await input.fill(':' + String(line));
  await page.waitForTimeout(200);
  await page.keyboard.press('Enter');
  await page.locator('.quick-input-widget').waitFor({ state: 'hidden', timeout: 15000 });
  await page.keyboard.press('Home');
  await page.keyboard.press('Home');
}

/** "Ln 18, Col 5" from the status bar. */
async function cursorText(page) {
  const item = page.locator('.statusbar-item', { hasText: /Ln \d+, Col \d+/ }).first();
  return (await item.count()) ? (await item.innerText()).trim() : '';
}

/** What the editor draws: the visible text (decorations' injected text included) and
 *  the struck-through spans. */
async function drawn(page) {
  return page.evaluate(() => {
    const root = document.querySelector('.monaco-editor .view-lines');
    // Per line, the struck-through text (the syntax colouring splits it into spans).
    const struck = [];
    for (const line of root ? root.querySelectorAll('.view-line') : []) {
      let text = '';
      for (const el of line.querySelectorAll('span')) {
        if (el.children.length === 0 && getComputedStyle(el).textDecorationLine.includes('line-through')) text += el.textContent;
      }
      if (text) struck.push(text.replace(/\u00a0/g, ' '));
    }
    // Each line as drawn: its text with the decorations' after-text (CSS ::after content)
    // where it is attached.
    const unquote = (c) => (c && c !== 'none' && c !== 'normal' ? JSON.parse(c.replace(/^'|'$/g, '"')) : '');
    const lines = [];
    for (const line of root ? root.querySelectorAll('.view-line') : []) {
      let text = '';
      for (const el of line.querySelectorAll('span')) {
        if (el.children.length === 0) text += el.textContent;
        text += unquote(getComputedStyle(el, '::after').content);
      }
      lines.push(text.replace(/\u00a0/g, ' '));
    }
    return { struck, lines };
  });
}

async function save(page) {
  await page.keyboard.press('Control+S');
  await waitFor('the saved file', async () => (await page.locator('.tab.dirty').count()) === 0, 15000);
  return fs.readFileSync(file, 'utf8');
}

async function main() {
  const ctx = await chromium.launchPersistentContext(env.E2E_BROWSER_PROFILE, {
    executablePath: env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    viewport: { width: 1400, height: 900 },
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  const page = ctx.pages()[0] || (await ctx.newPage());
  page.setDefaultTimeout(30000);
  try {
    await page.goto(`${env.E2E_URL}/?folder=${encodeURIComponent(env.E2E_WORKSPACE)}`);
    await page.locator('.monaco-workbench').waitFor({ state: 'visible', timeout: 90000 });
    await waitFor('the server to start', () => /server started/.test(extensionLog()), 90000);
    await openFile(page, env.E2E_FILE);
    step('opened');

    // --- A: an edit, a pause, the prediction drawn; Tab jumps, Tab accepts -------------
    let n = nextLog().length;
    await gotoLine(page, 17);
    for (let i = 0; i < 4; i++) await page.keyboard.press('ArrowRight');
    for (let i = 0; i < 5; i++) await page.keyboard.press('Shift+ArrowRight');
    await page.keyboard.type('logger.info');
    out.shownA = await waitLog('the prediction on line 18', /next edit shown/, n);
    await page.waitForTimeout(300); // let it render
    out.drawnA = await drawn(page);
    if (env.E2E_SCREENSHOT) await page.screenshot({ path: env.E2E_SCREENSHOT });
    out.cursorBeforeJump = await cursorText(page);
    step('A shown', { line: out.shownA });
    n = nextLog().length;
    await page.keyboard.press('Tab');
    out.jumpA = await waitLog('the jump', /next edit jumped/, n);
    await page.waitForTimeout(200);
    out.cursorAfterJump = await cursorText(page);
    out.diskAfterJump = fs.readFileSync(file, 'utf8');
    n = nextLog().length;
    await page.keyboard.press('Tab');
    out.acceptA = await waitLog('the accept', /next edit accepted/, n);
    step('A accepted', { jump: out.jumpA, accept: out.acceptA });

    // --- B: the next prediction (asked after the accept) dismissed with Escape ----------
    out.shownB = await waitLog('the chained prediction', /next edit shown/, n);
    n = nextLog().length;
    await page.keyboard.press('Escape');
    out.dismissB = await waitLog('the dismissal', /next edit dismissed/, n);
    await page.waitForTimeout(200);
    out.drawnB = await drawn(page);
    await page.keyboard.press('Tab'); // no prediction: Tab indents as usual
    await page.waitForTimeout(300);
    out.afterB = await save(page);
    step('B dismissed');

    // --- C: an answer for another version is never shown --------------------------------
    n = nextLog().length;
    await gotoLine(page, 5);
    for (let i = 0; i < 4; i++) await page.keyboard.press('ArrowRight');
    for (let i = 0; i < 9; i++) await page.keyboard.press('Shift+ArrowRight');
    await page.keyboard.type('fib');
    out.staleC = await waitLog('the stale answer', /next edit dropped: stale/, n);
    await page.waitForTimeout(500);
    out.logC = nextLog().slice(n);
    out.afterC = await save(page);
    step('C refused', { line: out.staleC });

    // --- D: the palette command; an insertion at the cursor, one Tab accepts ------------
    await gotoLine(page, 2);
    await page.keyboard.press('End');
    n = nextLog().length;
    await palette(page, 'echoline: Predict Next Edit');
    out.shownD = await waitLog('the insertion', /next edit shown/, n);
    await page.waitForTimeout(300);
    out.drawnD = await drawn(page);
    if (env.E2E_GHOST_SCREENSHOT) await page.screenshot({ path: env.E2E_GHOST_SCREENSHOT });
    n = nextLog().length;
    await page.keyboard.press('Tab');
    out.acceptD = await waitLog('the accept', /next edit accepted/, n);
    out.logD = nextLog().slice(n);
    out.afterD = await save(page);
    step('D accepted');
    out.ok = true;
  } catch (e) {
    out.ok = false;
    out.error = String((e && e.stack) || e);
    try {
      await page.screenshot({ path: env.E2E_OUT + '.fail.png' });
    } catch {}
  } finally {
    out.log = extensionLog().slice(-20000);
    fs.writeFileSync(env.E2E_OUT, JSON.stringify(out, null, 2));
    await ctx.close();
  }
  process.exit(out.ok ? 0 : 1);
}

main();
