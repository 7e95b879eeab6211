// What the code-server drivers (e2e.cjs, next_edit_e2e.cjs) share: the browser and the
// workbench they drive, the findings file (E2E_OUT, JSON, written whether the run passed
// or not, with the extension's log), the extension's log, waiting, and the workbench
// moves (the command palette, Quick Open to a file or a line). Every input comes from
// the environment that tests/test_editor_vscode*.py set.
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require(process.env.PLAYWRIGHT_CORE || 'playwright-core');

const env = process.env;

/** A step logger recording into `out.steps`. */
function stepper(out) {
  return (name, extra) => {
    out.steps.push({ name, t: Date.now(), ...extra });
    console.log(`[e2e] ${name}`);
  };
}

/** The extension's log file (LogOutputChannel) under the user-data dir. */
function extensionLog() {
  const root = path.join(env.E2E_USER_DATA, 'logs');
  const found = [];
  const walk = (d) => {
    for (const e of fs.existsSync(d) ? fs.readdirSync(d, { withFileTypes: true }) : []) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/echoline\.log$/.test(e.name)) found.push(p);
    }
  };
  walk(root);
  return found.map((p) => fs.readFileSync(p, 'utf8')).join('\n');
}

/** waitFor(what, fn, timeout, every): polls `fn` until it returns something truthy
 *  (returned), failing after `timeout` ms; the defaults are the driver's. */
function waiter(defaultTimeout, defaultEvery) {
  return async function waitFor(what, fn, timeout = defaultTimeout, every = defaultEvery) {
    const t0 = Date.now();
    for (;;) {
      const v = await fn();
      if (v) return v;
      if (Date.now() - t0 > timeout) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, every));
    }
  };
}

/** Run the command `title` from the palette; `closed`: wait until the palette is gone. */
async function palette(page, title, closed = false) {
  await page.keyboard.press('F1');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible', timeout: 15000 });
  await input.fill('>' + title);
  const row = page.locator('.quick-input-list .monaco-list-row', { hasText: title }).first();
  await row.waitFor({ state: 'visible', timeout: 15000 });
  await page.keyboard.press('Enter');
  if (closed) {
    await page.locator('.quick-input-widget').waitFor({ state: 'hidden', timeout: 15000 });
  }
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

/** Cursor at column 1 of `line` (`end`: at its end). */
async function gotoLine(page, line, end) {
  // Quick Open's ":<line>" (Ctrl+G does not reach the page in every browser set-up).
  await page.keyboard.press('Control+P');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible', timeout: 15000 });
  await input.fill(':' + String(line));
  await page.waitForTimeout(200);
  await page.keyboard.press('Enter');
  await page.locator('.quick-input-widget').waitFor({ state: 'hidden', timeout: 15000 });
  await page.keyboard.press(end ? 'End' : 'Home');
  if (!end) {
    // Home toggles between the first non-blank and column 1; make sure of column 1.
    await page.keyboard.press('Home');
  }
}

/** Open the workspace in headless Chromium, run `body(page)` once the workbench shows,
 *  write `out` (ok, error, the log's tail) to E2E_OUT and exit 0 when `body` passed. */
async function drive(out, body) {
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
    await body(page);
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

module.exports = { stepper, extensionLog, waiter, palette, openFile, gotoLine, drive };
