#!/usr/bin/env bash
# Installs a Python module from PyPI when python3 cannot import it, then checks the import.
#   scripts/ensure-python-module.sh MODULE [PIP_REQUIREMENT]   (the requirement defaults to MODULE)
# Used by scripts/test and bench/run.sh: the system test's SMTP server (aiosmtpd), the callback
# receiver's signature check (standardwebhooks).
set -euo pipefail
module=$1 requirement=${2:-$1}
if ! python3 -c "import $module" 2>/dev/null; then
    echo "$(basename "$0"): installing $requirement (PyPI)" >&2
    python3 -m pip install -q "$requirement" 2>&1 | grep -v 'Running pip as' >&2 || true
    python3 -c "import $module"
fi
