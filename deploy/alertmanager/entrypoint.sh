#!/bin/sh
# Starts Alertmanager with the webhook receiver when HEALTHPLANE_ALERT_WEBHOOK_URL is set,
# and without a receiver otherwise (alerts then collect in the UI).
#
# Alertmanager does not expand environment variables in its config file. Rather than
# templating the URL into YAML (quoting, and a secret in a rendered file), the URL goes to
# a file of its own that alertmanager-webhook.yml reads through `url_file`.
# The paths are variables only so that a test can run this script outside the image.
set -eu
config_dir=${ALERTMANAGER_CONFIG_DIR:-/etc/alertmanager}
storage=${ALERTMANAGER_STORAGE:-/alertmanager}
binary=${ALERTMANAGER_BIN:-/bin/alertmanager}

config=$config_dir/alertmanager.yml
if [ -n "${HEALTHPLANE_ALERT_WEBHOOK_URL:-}" ]; then
    umask 077
    printf '%s' "$HEALTHPLANE_ALERT_WEBHOOK_URL" > "$storage/webhook-url"
    config=$config_dir/alertmanager-webhook.yml
    echo "alertmanager: forwarding alerts to the webhook in HEALTHPLANE_ALERT_WEBHOOK_URL" >&2
else
    echo "alertmanager: HEALTHPLANE_ALERT_WEBHOOK_URL is not set; alerts collect in the UI only" >&2
fi
exec "$binary" --config.file="$config" --storage.path="$storage" "$@"
