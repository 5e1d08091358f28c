#!/usr/bin/env bash
# Install Debian's Chromium for the browser test (tests/browser/) when it is missing and we may install it.
# Playwright drives this browser at /usr/bin/chromium; it must never download a browser of its own
# (never run `playwright install`).
#
# What it installs on the system: the `chromium` package and the libraries it depends on, nothing
# it only recommends (--no-install-recommends). `apt-get install -s` on a Debian 12 machine that had
# a Python toolchain: 25 packages, none upgraded, where a plain `apt-get install chromium` installs
# 131, 15 of them upgrades (systemd, udev, perl); what it only recommends (chromium-sandbox, avahi,
# cups, samba libraries...) a headless browser driven by Playwright does not use.
# SKIP_BROWSER_INSTALL=1 installs nothing (make test SKIP_BROWSER_INSTALL=1): the browser test is
# then skipped unless Chromium is already there.
#
# Always exits 0: without Chromium the browser test is skipped with the reason, the rest of `make test` runs.
set -u
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}  # another path only for this script's own test
INSTALL="apt-get install -y -qq --no-install-recommends chromium"

if [ -x "$CHROMIUM" ]; then
    exit 0
fi

if [ "${SKIP_BROWSER_INSTALL:-0}" != "0" ]; then
    echo "SKIP_BROWSER_INSTALL=$SKIP_BROWSER_INSTALL: Chromium not installed, the browser test will be skipped." \
         "To install it yourself: sudo $INSTALL"
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
    echo "Installing Debian's chromium and the libraries it needs for the browser test" \
         "(skip with SKIP_BROWSER_INSTALL=1)..."
    # stdout is apt's progress; its errors (stderr) stay visible.
    if $AS_ROOT apt-get update -qq >/dev/null \
        && $AS_ROOT env DEBIAN_FRONTEND=noninteractive $INSTALL >/dev/null \
        && [ -x "$CHROMIUM" ]; then
        echo "Installed $("$CHROMIUM" --version 2>/dev/null)."
        exit 0
    fi
    echo "Installing chromium with apt-get failed (see the messages above)."
fi

echo "Chromium is not installed at $CHROMIUM and cannot be installed here: the browser test will be skipped." \
     "Install it with: sudo $INSTALL"
exit 0
