#!/usr/bin/env bash
# Install Debian's Chromium for the browser test when it is missing and we may install it.
# Playwright drives this browser; it must never download a browser of its own.
set -u
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing Debian's chromium for the browser test..."
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
        && exit 0
fi
echo "Chromium is not installed and cannot be installed here: the browser test will be skipped." \
     "Install it with: sudo apt-get install chromium"
exit 0
