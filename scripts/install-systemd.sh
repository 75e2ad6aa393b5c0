#!/usr/bin/env bash
# Install launcher as the systemd service launcher@NAME (see docs/systemd.md). Idempotent:
# run it again after changing the config or the code; it converges and restarts the service,
# which leaves the servers running (KillMode=process) and adopts them again.
#
# usage: scripts/install-systemd.sh [--dry-run] [--no-start] [--env FILE] [--slack-webhook FILE]
#                                   [--source DIR] [--python PYTHON] [--systemd-version N]
#                                   NAME [CONFIG.toml]
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: install-systemd.sh [options] NAME [CONFIG.toml]

Installs launcher for /etc/launcher/NAME.toml as the systemd service launcher@NAME:
  1. a system user `launcher` with home /var/lib/launcher-home and ~/.ssh (0700)
  2. a venv in /opt/launcher/.venv with launcher and its `ha` extra (asyncpg, for
     [coordination]) installed from --source
  3. /etc/launcher/NAME.toml (root:launcher 0640) from CONFIG; kept as is when CONFIG is omitted
  4. /etc/launcher/NAME.env (root:root 0600) from --env; the commented example when missing;
     /etc/launcher/NAME.slack-webhook (root:root 0600, the unit's LoadCredential=) from
     --slack-webhook; created empty (no Slack) when missing
  5. /etc/systemd/system/launcher@.service (plus, on systemd >= 254, the drop-in
     launcher@.service.d/restart-steps.conf), daemon-reload, enable and (re)start launcher@NAME

options:
  --dry-run      print the steps, change nothing (does not need root)
  --no-start     install and enable, but do not (re)start the service
  --env FILE     overrides for the service (KEY=VALUE lines); replaces NAME.env
  --slack-webhook FILE  a file holding the Slack webhook URL; replaces NAME.slack-webhook
  --source DIR   what to pip install (default: this checkout)
  --python PATH  Python >= 3.11 for the venv (default /usr/bin/python3; Debian needs the
                 python3-venv package). The service user must be able to run it.
  --systemd-version N  install for this systemd version (default: systemctl --version)
  -h, --help     this text
USAGE
}

here="$(cd "$(dirname "$0")/.." && pwd)"
dry_run=0
start=1
env_file=""
webhook_file=""
systemd_version=""
source_dir="$here"
python=/usr/bin/python3
# Fixed: the unit names them (User=, ExecStart=, ProtectHome= reasoning in docs/systemd.md).
prefix=/opt/launcher
user=launcher
home=/var/lib/launcher-home
etc=/etc/launcher
unit_dir=/etc/systemd/system
name=""
config=""

die() {
  echo "install-systemd: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --no-start) start=0 ;;
    --env) [ $# -ge 2 ] || die "--env needs a file"; env_file="$2"; shift ;;
    --slack-webhook) [ $# -ge 2 ] || die "--slack-webhook needs a file"; webhook_file="$2"; shift ;;
    --systemd-version) [ $# -ge 2 ] || die "--systemd-version needs a number"
      systemd_version="$2"; shift ;;
    --source) [ $# -ge 2 ] || die "--source needs a directory"; source_dir="$2"; shift ;;
    --python) [ $# -ge 2 ] || die "--python needs a path"; python="$2"; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option $1" ;;
    *)
      if [ -z "$name" ]; then name="$1"
      elif [ -z "$config" ]; then config="$1"
      else usage >&2; die "too many arguments"
      fi
      ;;
  esac
  shift
done

[ -n "$name" ] || { usage >&2; die "missing NAME"; }
# systemd instance names may hold more, but NAME is also a file name under /etc/launcher.
[[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || die "NAME '$name' may only use letters, digits, '_', '.', '-'"
[ -z "$config" ] || [ -f "$config" ] || die "config $config is not a file"
[ -z "$env_file" ] || [ -f "$env_file" ] || die "env file $env_file is not a file"
[ -z "$webhook_file" ] || [ -f "$webhook_file" ] || die "webhook file $webhook_file is not a file"
if [ -z "$systemd_version" ]; then
  systemd_version="$(systemctl --version 2>/dev/null | sed -n '1s/^systemd \([0-9]*\).*/\1/p')"
fi
[[ "$systemd_version" =~ ^[0-9]+$ ]] ||
  die "cannot tell the systemd version (pass --systemd-version N)"
[ -f "$source_dir/pyproject.toml" ] || die "--source $source_dir has no pyproject.toml"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
  die "$python is not a Python >= 3.11 (pass --python PATH)"
if [ "$dry_run" = 0 ] && [ "$(id -u)" != 0 ]; then
  die "must run as root (or pass --dry-run to see the steps)"
fi
if [ -z "$config" ] && [ ! -f "$etc/$name.toml" ]; then
  [ "$dry_run" = 1 ] || die "no $etc/$name.toml yet: pass the CONFIG.toml to install"
fi

unit="$here/systemd/launcher@.service"
# Settings only systemd >= 254 knows: a drop-in, so systemd 252 never sees them (no warning).
dropin="$here/systemd/launcher@.service.d/restart-steps.conf"
example="$here/systemd/launcher.env.example"
venv="$prefix/.venv"

# Print a step (quoted so it can be pasted into a shell); run it unless this is a dry run.
step() {
  echo "+$(printf ' %q' "$@")"
  if [ "$dry_run" = 0 ]; then
    "$@"
  fi
}

if ! getent passwd "$user" >/dev/null; then
  step useradd --system --user-group --home-dir "$home" --create-home \
    --shell /usr/sbin/nologin --comment "launcher daemon" "$user"
fi
# SSH keys, known_hosts and ssh config for the GPU hosts live here; the service sees it read-only.
step install -d -m 0750 -o "$user" -g "$user" "$home"
step install -d -m 0700 -o "$user" -g "$user" "$home/.ssh"

if [ ! -x "$venv/bin/python" ]; then
  step "$python" -m venv "$venv"
fi
# With the `ha` extra (the PostgreSQL client asyncpg): a config with [coordination] needs it,
# and without it `up` refuses to start (exit 2; docs/ha.md).
step "$venv/bin/pip" install --quiet --disable-pip-version-check "$source_dir[ha]"
# The same version number may carry new code (a checkout between releases): replace ours.
step "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall \
  "$source_dir"
# A venv whose interpreter lives somewhere the service user cannot read (a pyenv under /root)
# would only fail at `systemctl start`; fail here instead.
step runuser -u "$user" -- "$venv/bin/python" -I -c "import launcher.cli.main, asyncpg" ||
  die "user $user cannot run $venv/bin/python; remove $venv and rerun with --python PATH"
step install -D -m 0644 "$here/docs/systemd.md" "$prefix/docs/systemd.md"

step install -d -m 0750 -o root -g "$user" "$etc"
if [ -n "$config" ]; then
  step install -m 0640 -o root -g "$user" "$config" "$etc/$name.toml"
fi
if [ -n "$env_file" ]; then
  step install -m 0600 -o root -g root "$env_file" "$etc/$name.env"
elif [ ! -f "$etc/$name.env" ]; then
  step install -m 0600 -o root -g root "$example" "$etc/$name.env"
fi
# The unit's LoadCredential= needs the file to exist; empty means "no webhook".
if [ -n "$webhook_file" ]; then
  step install -m 0600 -o root -g root "$webhook_file" "$etc/$name.slack-webhook"
elif [ ! -f "$etc/$name.slack-webhook" ]; then
  step install -m 0600 -o root -g root /dev/null "$etc/$name.slack-webhook"
fi

step install -m 0644 "$unit" "$unit_dir/launcher@.service"
if [ "$systemd_version" -ge 254 ]; then
  step install -D -m 0644 "$dropin" "$unit_dir/launcher@.service.d/restart-steps.conf"
elif [ -e "$unit_dir/launcher@.service.d/restart-steps.conf" ]; then
  step rm -f "$unit_dir/launcher@.service.d/restart-steps.conf"  # systemd was downgraded
else
  echo "install-systemd: systemd $systemd_version < 254: restarts every 5 s (no RestartSteps=)"
fi
step systemctl daemon-reload
step systemctl enable "launcher@$name.service"
if [ "$start" = 1 ]; then
  # restart, not start: it also applies a changed config or code, and the servers survive it.
  step systemctl restart "launcher@$name.service"
fi

if [ "$dry_run" = 1 ]; then
  echo "install-systemd: dry run, nothing changed"
else
  echo "install-systemd: installed launcher@$name; follow it with: journalctl -u launcher@$name -f"
fi
