#!/usr/bin/env bash
# Install Debian's Chromium for the browser test (tests/browser/) when it is missing and we may install it.
# Playwright drives this browser at /usr/bin/chromium; it must never download a browser of its own
# (never run `playwright install`).
#
# Always exits 0: without Chromium the browser test is skipped with the reason, the rest of `make test` runs.
set -u
CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
    exit 0
fi

# Root installs directly (containers, CI); anyone else only through a sudo that needs no password.
if [ "$(id -u)" = "0" ]; then
    AS_ROOT=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    AS_ROOT="sudo -n"
else
    AS_ROOT="none"
fi

if [ "$AS_ROOT" != "none" ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing Debian's chromium for the browser test..."
    # stdout is apt's progress; its errors (stderr) stay visible.
    if $AS_ROOT apt-get update -qq >/dev/null \
        && $AS_ROOT env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
        && [ -x "$CHROMIUM" ]; then
        echo "Installed $("$CHROMIUM" --version 2>/dev/null)."
        exit 0
    fi
    echo "Installing chromium with apt-get failed (see the messages above)."
fi

echo "Chromium is not installed at $CHROMIUM and cannot be installed here: the browser test will be skipped." \
     "Install it with: sudo apt-get install chromium"
exit 0
