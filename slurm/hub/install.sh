#!/usr/bin/env bash
# What the workshop hub needs beyond the workbook's venv (pip installs JupyterHub and
# batchspawner there: pyproject.toml's "hub" extra, part of `make setup`):
#   sudo                       batchspawner runs sbatch, squeue and scancel as the learner
#                              (sudo -E -u NAME), so each JupyterLab job is the learner's;
#   configurable-http-proxy    JupyterHub's proxy, from npm (node >= 20).
# Idempotent; needs root and the package registries only when something is missing.
set -euo pipefail
PROXY_VERSION=5.3.0
say() { echo "hub install: $*"; }
die() { echo "hub install: error: $*" >&2; exit 1; }

apt_install() {
  [[ $(id -u) == 0 ]] || die "'$*' is missing; install it as root: apt-get install -y $*"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "$@" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$@" >/dev/null; } \
    || die "apt-get install $* failed"
}

command -v sudo >/dev/null || { say "installing sudo"; apt_install sudo; }
command -v npm >/dev/null || { say "installing nodejs and npm"; apt_install nodejs npm; }
if ! command -v configurable-http-proxy >/dev/null; then
  [[ $(id -u) == 0 ]] || die "configurable-http-proxy is missing; as root: npm install -g configurable-http-proxy@$PROXY_VERSION"
  say "installing configurable-http-proxy $PROXY_VERSION from npm"
  npm install -g --no-fund --no-audit --loglevel=error "configurable-http-proxy@$PROXY_VERSION" >/dev/null \
    || die "npm install -g configurable-http-proxy@$PROXY_VERSION failed"
fi
